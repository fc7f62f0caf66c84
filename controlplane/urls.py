"""Top-level URL map: each app owns its own urls module."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from controlplane.api_docs import RedocView, SwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("scheduling.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", RedocView.as_view(url_name="schema"), name="api-redoc"),
    path("", include("monitoring.urls")),
    path("", include("frontend.urls")),
]

handler500 = "controlplane.errors.server_error"  # a database out of reach: 503, not a 500 page
