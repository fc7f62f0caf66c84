"""Tessera's one settings module, driven by the environment.

Unset, everything runs embedded (SQLite, in-memory channel layer, passes in-process). Setting
``DATABASE_URL``, ``REDIS_URL`` and ``PROMETHEUS_URL`` switches each part to the real service.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from csp.constants import NONE, SELF

from controlplane.env import (
    channel_layer_host,
    database_from_url,
    env_bool,
    env_bounds,
    env_engine_knobs,
    env_float,
    env_floats,
    env_int,
    env_list,
    env_log_level,
    env_rate,
    env_secret,
    env_url,
    redis_db_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

# Off unless asked for: a debug page shows settings and tracebacks to whoever triggers one.
DEBUG = env_bool("TESSERA_DEBUG", False)
SECRET_KEY = env_secret("TESSERA_SECRET_KEY", VAR_DIR / "secret-key")
ALLOWED_HOSTS = env_list("TESSERA_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("TESSERA_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc from the package, not from a CDN
    "channels",
    "scheduling",
    "monitoring",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "controlplane.private_pages.PrivatePagesNotStored",  # a signed-in person's pages: no-store
    "controlplane.audit_actor.AuditActorMiddleware",  # who acted, for the audit log's signals
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: turns a lockout into its page
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
DATABASES = {"default": database_from_url(DATABASE_URL, BASE_DIR)}
ON_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL: a reader keeps its snapshot while writers commit (export_trace reads every table in
    # one; a long read never stops a submit).
    DATABASES["default"]["OPTIONS"].setdefault("init_command", "PRAGMA journal_mode=WAL")
    # Tests on SQLite use a file as the embedded install does, not Django's default shared-cache
    # in-memory database: there a second connection's write fails at once ("database table is
    # locked") while another reads, where a file database lets it wait or, in WAL, go ahead.
    DATABASES["default"].setdefault(
        "TEST", {"NAME": os.path.join(tempfile.gettempdir(), f"tessera-test-{os.getpid()}.sqlite3")}
    )
# Sync views (and their middleware) run in a pool of this many threads per web process
# (controlplane/pooled_handler.py); 0: Django's own ASGI handler. On by default with PostgreSQL,
# outside pytest (whose test client shares the test's one connection and transaction).
WEB_THREADS = env_int(
    "TESSERA_WEB_THREADS", 8 if ON_POSTGRES and not os.environ.get("PYTEST_VERSION") else 0, minimum=0
)
DB_POOL_TIMEOUT_S = env_float("TESSERA_DB_POOL_TIMEOUT_S", 3.0, minimum=0.1)
if ON_POSTGRES and env_bool("TESSERA_DB_POOL", not os.environ.get("PYTEST_VERSION")):
    # A connection pool per process (psycopg_pool): without it every request opens a new
    # PostgreSQL connection (Django runs each request's sync code in a thread of its own, so
    # persistent per-thread connections would pile up instead). Off inside pytest, whose test
    # databases are made and dropped under the tests' feet; the servers tests start use it.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        # The view threads, Django's own thread and the long-poll's lookups.
        # A request waits at most TESSERA_DB_POOL_TIMEOUT_S for a connection, then answers 503
        # (controlplane/errors.py): with a connection per thread and spare ones, only a
        # database out of reach makes it wait. It was 20 s: during an outage every request
        # and every agent's heartbeat held a web thread that long, and /metrics outlasted
        # Prometheus's scrape timeout. A reconnection gives up after as long, and the next
        # request starts another at once: psycopg_pool's own backoff doubled up to 5 minutes,
        # so the web answered errors for up to a minute after the database was back.
        "pool": {
            "min_size": 1,
            "max_size": env_int("TESSERA_DB_POOL_MAX", WEB_THREADS + 4, minimum=1),
            "timeout": DB_POOL_TIMEOUT_S,
            "reconnect_timeout": DB_POOL_TIMEOUT_S,
        },
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_url("REDIS_URL", ("redis", "rediss"))
PROMETHEUS_URL = env_url("PROMETHEUS_URL", ("http", "https"))

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [channel_layer_host(redis_db_url(REDIS_URL, env_int("TESSERA_REDIS_LAYER_DB", 1)))]
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: used only when Redis is configured; the embedded default runs passes in-process.
CELERY_BROKER_URL = redis_db_url(REDIS_URL, env_int("TESSERA_REDIS_BROKER_DB", 0)) if REDIS_URL else ""
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# For as long as Redis is away: Celery's default (100 attempts, 2 to 30 s apart) ended the worker
# ("Unrecoverable error") after about 46 minutes of an outage, and no pass ran once Redis was back
# unless something restarted the worker.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_ALWAYS_EAGER = False

# --- The web front in production -----------------------------------------------------------------
# Content-Security-Policy (django-csp) on every page: scripts, styles, images, fonts and
# connections from this origin only (websockets too), nothing may frame the pages, no plugins.
# /api/redoc/ relaxes it for itself (scheduling/api/docs.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# TESSERA_TLS=1: the site is served over HTTPS: HTTP is redirected to HTTPS, browsers are told to
# use HTTPS only (HSTS) and cookies are sent over HTTPS only. Unset, plain HTTP works
# (docker-compose's default). TESSERA_TLS_PROXY=1: TLS ends at a proxy in front of daphne which
# sets X-Forwarded-Proto (and strips a client's own): only then is that header believed; else a
# client could claim HTTPS with it.
# /metrics and the agents' API are not redirected: what calls them is configured with its URL,
# and a redirect would come after the credential was already sent.
TLS = env_bool("TESSERA_TLS", False)
if TLS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^metrics$", r"^api/v1/agent/"]
    SECURE_HSTS_SECONDS = env_int("TESSERA_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TESSERA_HSTS_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("TESSERA_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
if env_bool("TESSERA_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Sign-in throttling (controlplane/login_throttle.py): a username is locked for
# TESSERA_LOGIN_LOCKOUT_MINUTES after TESSERA_LOGIN_FAILURE_LIMIT wrong passwords on /login/ or
# /admin/login/.
AUTHENTICATION_BACKENDS = [
    "controlplane.login_throttle.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TESSERA_LOGIN_FAILURE_LIMIT", 15, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("TESSERA_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=1.0))
# Either is locked on its own: an account (whatever the address: a slow guess from many machines)
# and an address (whatever the account: one machine spraying a password over many).
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlplane.login_throttle.locked_out"
AXES_VERBOSE = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
# A stale form (signed in again in another tab) answers in the portal's layout, with a way back.
CSRF_FAILURE_VIEW = "frontend.views.csrf_failure"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"

# Largest request body accepted (bytes); above it the API answers 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("TESSERA_MAX_BODY_BYTES", 1_048_576, minimum=1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "scheduling.api.user_auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "scheduling.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": ["scheduling.api.parsers.StrictJSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": ["scheduling.api.throttling.UserRateLimit"],
    # ?format=xml is a 400 naming format, not DRF's bare 404
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "scheduling.api.negotiation.NamedFormatNegotiation",
}

# Per-user request limits (429 with Retry-After above them): job submissions, and every user API
# request. "N/s", "N/m", "N/h" or "off".
TESSERA_RATE_LIMITS = {
    "submit": env_rate("TESSERA_RATE_LIMIT_SUBMIT", "1200/m"),
    "api": env_rate("TESSERA_RATE_LIMIT_API", "6000/m"),
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera API",
    "DESCRIPTION": "Submit and watch GPU jobs; inspect nodes, tenants and quotas.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # A text field that refuses "" says so (minLength 1), as tests/api/test_schemathesis.py checks.
    "ENFORCE_NON_BLANK_FIELDS": True,
    # The docs' code from the drf-spectacular-sidecar package (controlplane/api_docs.py); no
    # validator badge (it would fetch an image from swagger.io, telling it the schema's URL).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # Every operation declares its error answers (400/401/403/404/409/413/415/422/429).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "scheduling.api.schema.declare_errors",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {"database_unreachable": {"()": "controlplane.errors.DatabaseUnreachableFilter"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "tessera": {"level": env_log_level("TESSERA_LOG_LEVEL", "INFO" if DEBUG else "WARNING")},
        # A request that could not reach the database: one line each, not a traceback.
        "django.request": {"filters": ["database_unreachable"]},
    },
}

# --- Tessera's own knobs ------------------------------------------------------------------------
TESSERA: dict[str, Any] = {
    # The scheduling pass: in-process loop in the embedded default, Celery beat with Redis.
    "EMBEDDED_PASSES": not REDIS_URL or env_bool("TESSERA_EMBEDDED_PASSES", False),
    # Whether this process starts the in-process pass loop (the embedded default's web process).
    # Off by default inside pytest (PYTEST_VERSION), where tests run passes explicitly; a test
    # that starts a web server subprocess sets TESSERA_PASS_LOOP=1 for it.
    "PASS_LOOP": env_bool(
        "TESSERA_PASS_LOOP",
        (not REDIS_URL or env_bool("TESSERA_EMBEDDED_PASSES", False))
        and not os.environ.get("PYTEST_VERSION"),
    ),
    "PASS_INTERVAL_S": env_float("TESSERA_PASS_INTERVAL_S", 5.0, minimum=0.1),
    "MAX_STARTS_PER_PASS": env_int("TESSERA_MAX_STARTS_PER_PASS", 2000, minimum=1),
    # A pass stops deciding more jobs this long after it began deciding (it applies what it
    # decided and asks for another pass, which decides the jobs it did not reach first). Far
    # above what a pass takes, even a large one (docs/benchmarks/scheduling-pass.md). The
    # Celery task's soft and hard time limits (scheduling/tasks.py) are set well above this.
    "PASS_BUDGET_S": env_float("TESSERA_PASS_BUDGET_S", 10.0, minimum=0.01),
    # Start estimates (engine/eta.py: about 2 s of CPU for 1,000 pending jobs on 1,000 nodes) are
    # planned by a pass at most this often in a process; the passes between keep them as stored.
    "ETA_EVERY_S": env_float("TESSERA_ETA_EVERY_S", 15.0, minimum=0.0),
    "MAX_JOB_GPUS": env_int("TESSERA_MAX_JOB_GPUS", 4096, minimum=1),
    # CPUs per replica of a CPU-only job that asks for none: counted against the node's CPUs by
    # the scheduler and enforced by the agent, so one tenant's CPU-only jobs cannot fill a node.
    "CPU_JOB_CPUS": env_float("TESSERA_CPU_JOB_CPUS", 1.0, minimum=0.001),
    "LOG_CAP_BYTES": env_int("TESSERA_LOG_CAP_BYTES", 4 * 1024 * 1024, minimum=1024),
    "HEARTBEAT_TIMEOUT_S": env_float("TESSERA_HEARTBEAT_TIMEOUT_S", 30.0, minimum=1.0),
    "LEASE_S": env_float("TESSERA_LEASE_S", 60.0, minimum=1.0),
    # A lost node's jobs are requeued only this long after their lease ran out, not at once: the
    # agent kills them at its own deadline (which comes first: it counts from the heartbeat's send),
    # but the kill itself takes a moment, and so may a loaded agent's wake-up; the agent's clock
    # and the server's run at slightly different rates, and the web process that stamped the
    # heartbeat and the worker that sweeps may not read the same wall clock (docs/agent.md).
    "FENCE_MARGIN_S": env_float("TESSERA_FENCE_MARGIN_S", 5.0, minimum=0.0),
    "IDEMPOTENCY_TTL_S": env_int("TESSERA_IDEMPOTENCY_TTL_S", 24 * 3600, minimum=60),
    "RETRY_BACKOFF_S": env_float("TESSERA_RETRY_BACKOFF_S", 10.0, minimum=0.0),
    # A job whose node is lost is requeued without using a retry this many times; the next node
    # loss fails it (a job that takes nodes down cannot take down node after node).
    "MAX_NODE_LOSSES": env_int("TESSERA_MAX_NODE_LOSSES", 3, minimum=0),
    # Webhooks: targets allowed although private, loopback or link-local (hosts or CIDRs), the
    # first retry's delay (doubling), and how many attempts before a delivery is marked failed.
    "WEBHOOK_ALLOWLIST": env_list("TESSERA_WEBHOOK_ALLOWLIST", []),
    "WEBHOOK_BACKOFF_S": env_float("TESSERA_WEBHOOK_BACKOFF_S", 10.0, minimum=0.0),
    "WEBHOOK_ATTEMPTS": env_int("TESSERA_WEBHOOK_ATTEMPTS", 6, minimum=1),
    "WEBHOOKS_PER_TENANT": env_int("TESSERA_WEBHOOKS_PER_TENANT", 20, minimum=1),
    # A newly registered node waits, cordoned, for an operator to uncordon it before it gets jobs.
    "APPROVE_NODES": env_bool("TESSERA_APPROVE_NODES", False),
    "WEB_THREADS": WEB_THREADS,
    # Off switches for the workarounds inside frameworks (docs/internals.md): each is on by
    # default; turning one off gives the library's own behaviour back, slower but with nothing of
    # its private API used (TESSERA_WEB_THREADS=0 does the same for the pooled request handler).
    "SKIP_FORM_PARSING": env_bool("TESSERA_SKIP_FORM_PARSING", True),
    "GC_TUNING": env_bool("TESSERA_GC_TUNING", True),
    "CELERY_OUTAGE_LOG": env_bool("TESSERA_CELERY_OUTAGE_LOG", True),
    "GC_PAUSE_IN_PASS": env_bool("TESSERA_GC_PAUSE_IN_PASS", True),
    "LIVE_PIPELINE": env_bool("TESSERA_LIVE_PIPELINE", True),
    "PREPARED_READS": env_bool("TESSERA_PREPARED_READS", True),
    "SERVER_PREPARED_READS": env_bool("TESSERA_SERVER_PREPARED_READS", True),
    "FIELD_TEMPLATES": env_bool("TESSERA_FIELD_TEMPLATES", True),
    "RIDING_TRANSACTIONS": env_bool("TESSERA_RIDING_TRANSACTIONS", True),
    # The dynamic-adjustment pass (services/adjust.py, the idle policy in engine/adjust.py):
    # every ADJUST_INTERVAL_S (Celery beat, or a thread of the embedded web process). The idle
    # policy's operator defaults; the demo shortens the windows to minutes.
    "ADJUST_INTERVAL_S": env_float("TESSERA_ADJUST_INTERVAL_S", 30.0, minimum=0.5),
    "IDLE_THRESHOLD": env_float("TESSERA_IDLE_THRESHOLD", 0.05, minimum=0.0),
    "IDLE_EXEMPT_S": env_float("TESSERA_IDLE_EXEMPT_S", 600.0, minimum=0.0),
    "IDLE_WARN_S": env_floats("TESSERA_IDLE_WARN_S", [900.0, 2700.0], minimum=0.0),
    "IDLE_ACT_S": env_float("TESSERA_IDLE_ACT_S", 3600.0, minimum=1.0),
    "IDLE_STEP_S": env_float("TESSERA_IDLE_STEP_S", 60.0, minimum=1.0),
    # What tenants may set for themselves (low,high each): scheduling/services/idle_policy.py.
    "IDLE_BOUNDS": {
        name: env_bounds(f"TESSERA_IDLE_BOUNDS_{name.upper()}", default)
        for name, default in (
            ("threshold", [0.01, 0.2]),
            ("exempt_s", [300.0, 7200.0]),
            ("act_after_s", [1800.0, 14400.0]),
        )
    },
    # The scheduler's knobs from TESSERA_ENGINE_<KNOB> (engine/config.py's KNOBS), as text:
    # defaults that the operator's scheduler-settings record overrides field by field.
    "ENGINE_KNOBS": env_engine_knobs(),
}
