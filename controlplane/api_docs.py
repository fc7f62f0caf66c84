"""The API's browsable docs (``/api/docs/`` Swagger UI, ``/api/redoc/`` ReDoc), served from this
site alone: their code comes from the drf-spectacular-sidecar package (pinned in the lock file),
never from a public CDN, so the pages work offline and run no third party's code with a signed-in
user's session.

Both keep to the site's Content-Security-Policy (``settings.CONTENT_SECURITY_POLICY``): Swagger
UI's start-up script is a file of its own (drf-spectacular's split view) and its page has no inline
style. ReDoc injects its styles at run time and searches in a ``blob:`` worker, so its page alone
also allows inline styles and such workers — never inline scripts.
"""

from __future__ import annotations

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.utils.decorators import method_decorator
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerSplitView


class SwaggerView(SpectacularSwaggerSplitView):
    template_name = "api/swagger_ui.html"


@method_decorator(csp_update({"style-src": [UNSAFE_INLINE], "worker-src": ["blob:"]}), name="dispatch")
class RedocView(SpectacularRedocView):
    template_name = "api/redoc.html"
