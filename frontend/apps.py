from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from frontend.consumers import end_session_sockets

        # Signing out closes that session's dashboard sockets (docs/websockets.md).
        user_logged_out.connect(end_session_sockets, dispatch_uid="frontend.end_session_sockets")
