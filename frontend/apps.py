from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_delete, post_save

        from frontend.consumers import end_session_sockets, viewer_changed
        from scheduling.models import Membership

        # Signing out closes that session's dashboard sockets; a change of a user's team or role
        # closes that user's, which rejoin as the new viewer (docs/websockets.md).
        user_logged_out.connect(end_session_sockets, dispatch_uid="frontend.end_session_sockets")
        for model in (Membership, get_user_model()):
            for signal in (post_save, post_delete):
                signal.connect(
                    viewer_changed, sender=model, dispatch_uid=f"frontend.viewer_changed.{model.__name__}"
                )
