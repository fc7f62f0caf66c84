from django.urls import path

from monitoring import views

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("metrics/targets", views.PrometheusTargets.as_view(), name="metrics-targets"),
]
