# Tessera's one image: web (daphne), Celery worker and beat, and the node agent — docker-compose.yml
# picks the process with `command:`. Runs as an unprivileged user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app
# The installed package and /app are the same code; PYTHONPATH makes every process (daphne,
# celery, manage.py, the agent) import it from /app alike, so settings.BASE_DIR is /app.
COPY . .
RUN pip install -c requirements/lock.txt . \
    && useradd --create-home --uid 10001 tessera \
    && mkdir -p /app/var \
    && chown tessera:tessera /app/var

USER tessera
EXPOSE 8000 9400
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "controlplane.asgi:application"]
