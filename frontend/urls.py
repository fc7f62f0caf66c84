"""Pages for people (session login); the REST API lives under /api/v1/."""

from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from frontend import jobs, tokens, views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("dashboard/state.json", views.state_json, name="dashboard-state"),
    path("dashboard/queue.json", views.queue_json, name="dashboard-queue"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new/", jobs.job_new, name="job-new"),
    path("jobs/cancel/", jobs.bulk_cancel, name="jobs-cancel"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel, name="job-cancel-page"),
    path("jobs/<int:pk>/hold/", jobs.job_hold, name="job-hold-page"),
    path("jobs/<int:pk>/release/", jobs.job_release, name="job-release-page"),
    path("jobs/<int:pk>/log.txt", jobs.job_log_download, name="job-log"),
    path("team/", views.team, name="team"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token-revoke"),
    # Browsers ask for it on pages that name no icon (the admin's, the API docs'): not a 404.
    path("favicon.ico", RedirectView.as_view(url=static("frontend/favicon.svg"), permanent=True)),
    path("", views.dashboard, name="dashboard"),
]
