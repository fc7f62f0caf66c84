"""URLs of the node agent protocol, mounted at ``/api/v1/agent/`` (see ``docs/agent.md``).

Each path answers with or without a trailing slash: agents are scripts, not browsers.
"""

from django.urls import re_path

from scheduling.api import agents
from scheduling.api.agent_wait import agent_wait

app_name = "agent"

urlpatterns = [
    re_path(r"^register/?$", agents.RegisterView.as_view(), name="register"),
    re_path(r"^wait/?$", agent_wait, name="wait"),
    re_path(r"^heartbeat/?$", agents.HeartbeatView.as_view(), name="heartbeat"),
    re_path(r"^jobs/(?P<job_id>[0-9]{1,18})/started/?$", agents.StartedView.as_view(), name="started"),
    re_path(r"^jobs/(?P<job_id>[0-9]{1,18})/logs/?$", agents.LogsView.as_view(), name="logs"),
    re_path(r"^jobs/(?P<job_id>[0-9]{1,18})/exited/?$", agents.ExitedView.as_view(), name="exited"),
    re_path(
        r"^jobs/(?P<job_id>[0-9]{1,18})/checkpointed/?$",
        agents.CheckpointedView.as_view(),
        name="checkpointed",
    ),
    re_path(r"^exits/?$", agents.ExitsView.as_view(), name="exits"),
]
