from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's place for it: the exporter reads the models, which load only after this module.
        from monitoring.exporter import register_collector

        register_collector()
