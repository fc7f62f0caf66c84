"""Pages for people (session login); the REST API lives under /api/v1/."""

from functools import partial

from django.contrib.staticfiles.views import serve
from django.urls import path

from frontend import views

# daphne serves no static files of its own; the app's few files (and the admin's) are served here
# through the staticfiles finders. A large deployment would put them behind a CDN or nginx.
serve_static = partial(serve, insecure=True)

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("dashboard/state.json", views.state_json, name="dashboard-state"),
    path("", views.dashboard, name="dashboard"),
    path("static/<path:path>", serve_static, name="static"),
]
