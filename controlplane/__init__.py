"""Tessera's Django project: settings, urls, ASGI routing and the Celery app."""

from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
