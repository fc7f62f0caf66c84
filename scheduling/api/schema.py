"""OpenAPI descriptions of the API's authentication schemes, for drf-spectacular.

Users send ``Authorization: Token <key>`` (DRF's own scheme, which drf-spectacular knows). Node
agents send ``Authorization: Node <credential>``, and ``Authorization: Join <token>`` to register;
those classes live in ``scheduling.api.agent_auth`` and are named here by path, so this module
loads whether or not that one exists.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "scheduling.api.agent_auth.NodeCredentialAuthentication"
    name = "nodeCredential"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A node agent's own credential: `Node <credential>` (issued at registration).",
        }


class JoinTokenScheme(OpenApiAuthenticationExtension):
    target_class = "scheduling.api.agent_auth.JoinTokenAuthentication"
    name = "joinToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "An operator-made join token: `Join <token>` (manage.py create_join_token).",
        }
