"""Websocket routes (mounted by controlplane.asgi under AuthMiddlewareStack)."""

from django.urls import path

from frontend.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
]
