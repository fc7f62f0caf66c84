"""ASGI entry point: HTTP through Django, websockets through Channels (the dashboard's, session-
authenticated; the agents' stream, node-credential-authenticated).

daphne serves static files itself through ``ASGIStaticFilesHandler``, so the embedded default and
a small deployment need no separate web server; a large one may put a proxy in front.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Django must be set up before the consumers (and their models) are imported.
django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

if settings.TESSERA["WEB_THREADS"]:
    # Sync views and their middleware in a pool of threads, one hop per request (see the module).
    from controlplane.pooled_handler import PooledASGIHandler

    django_asgi_app = PooledASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from frontend.routing import websocket_urlpatterns  # noqa: E402

if settings.TESSERA["PASS_LOOP"]:
    # The embedded default: the scheduling pass runs in this web process (scheduling/loop.py).
    # So does the adjustment pass (monitoring/loop.py).
    from monitoring.loop import start_adjust_loop
    from scheduling.loop import start_embedded_loop

    start_embedded_loop()
    start_adjust_loop()

from controlplane.body_limit import BodyLimit  # noqa: E402
from controlplane.daphne_requests import skip_form_parsing  # noqa: E402
from controlplane.gc_tuning import tune_for_server  # noqa: E402
from scheduling.api.agent_stream import STREAM_PATH, AgentStream  # noqa: E402

dashboard_sockets = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
agent_stream = AgentStream.as_asgi()


async def websockets(scope, receive, send):
    """The agents' stream (a node credential in a header: no session, no Origin check), or the
    dashboard's sockets (a signed-in person's session, from an allowed Origin)."""
    app = agent_stream if scope["path"] == STREAM_PATH else dashboard_sockets
    return await app(scope, receive, send)


# Bodies past TESSERA_MAX_BODY_BYTES are refused before Django reads them (controlplane/body_limit.py).
http = BodyLimit(ASGIStaticFilesHandler(django_asgi_app), settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
application = ProtocolTypeRouter({"http": http, "websocket": websockets})
if settings.TESSERA["SKIP_FORM_PARSING"]:
    skip_form_parsing()
if settings.TESSERA["GC_TUNING"]:
    tune_for_server()
