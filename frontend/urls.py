"""Pages for people (session login); the REST API lives under /api/v1/."""

from django.urls import path

from frontend import views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("dashboard/state.json", views.state_json, name="dashboard-state"),
    path("", views.dashboard, name="dashboard"),
]
