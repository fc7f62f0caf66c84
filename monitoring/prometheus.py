"""A thin reader of Prometheus (``settings.PROMETHEUS_URL``) through prometheus-api-client.

Used by the adjustment pass (``monitoring/adjust.py``) to see how busy a job's GPUs really are. The agents
export DCGM-style series (``DCGM_FI_DEV_GPU_UTIL{gpu, UUID, Hostname, job}``); since Prometheus
itself owns the label ``job`` (the scrape job's name), a scrape without ``honor_labels`` renames
the agent's to ``exported_job`` — :func:`gpu_utilisation` matches either.

Errors are one exception type, :class:`PrometheusUnavailable`, with a message that says what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import requests
from django.conf import settings
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
JOB_LABELS = ("exported_job", "job")  # the agent's job label, renamed or kept (see above)
NODE_LABEL = "Hostname"
DEFAULT_TIMEOUT_S = 5


class PrometheusUnavailable(RuntimeError):
    """Prometheus is not configured, cannot be reached, or refused the query."""


@dataclass(frozen=True)
class Sample:
    """One instant value of one series."""

    labels: dict[str, str] = field(hash=False)
    value: float
    timestamp: float

    @property
    def metric(self) -> str:
        return self.labels.get("__name__", "")


def _label_value(value: str) -> str:
    """A PromQL string literal for ``value`` (escaping quotes and backslashes: no injection)."""
    return '"' + re.sub(r'(["\\])', r"\\\1", value).replace("\n", "\\n") + '"'


def _matchers(**labels: str | None) -> str:
    return ",".join(f"{name}={_label_value(str(v))}" for name, v in labels.items() if v is not None)


def connect(url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """A ``PrometheusConnect`` for ``url`` (default: settings.PROMETHEUS_URL), retrying little so a
    down server fails fast."""
    url = url if url is not None else getattr(settings, "PROMETHEUS_URL", "")
    if not url:
        raise PrometheusUnavailable(
            "PROMETHEUS_URL is not set: point it at a Prometheus server (e.g. http://127.0.0.1:9090)"
        )

    retry = Retry(total=1, backoff_factor=0.1, status_forcelist=[502, 503, 504])
    return PrometheusConnect(url=url, disable_ssl=False, retry=retry, timeout=timeout_s)


def query(promql: str, url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Sample]:
    """Evaluate an instant PromQL query; vector and scalar results come back as samples."""
    prom = connect(url, timeout_s)
    try:
        result = prom.custom_query(promql)
    except requests.exceptions.RequestException as exc:
        raise PrometheusUnavailable(f"Prometheus at {prom.url} cannot be reached: {exc}") from exc
    except PrometheusApiClientException as exc:
        raise PrometheusUnavailable(f"Prometheus at {prom.url} refused {promql!r}: {exc}") from exc
    finally:
        prom.close()
    return _samples(result)


@dataclass(frozen=True)
class Series:
    """One series of a range (or subquery) result: its labels and its ``(t, value)`` points."""

    labels: dict[str, str] = field(hash=False)
    points: tuple[tuple[float, float], ...]


def query_series(promql: str, url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Series]:
    """Evaluate an instant query whose result is a range vector (``m[5m]``, a subquery)."""
    import requests
    from prometheus_api_client.exceptions import PrometheusApiClientException

    prom = connect(url, timeout_s)
    try:
        result = prom.custom_query(promql)
    except requests.exceptions.RequestException as exc:
        raise PrometheusUnavailable(f"Prometheus at {prom.url} cannot be reached: {exc}") from exc
    except PrometheusApiClientException as exc:
        raise PrometheusUnavailable(f"Prometheus at {prom.url} refused {promql!r}: {exc}") from exc
    finally:
        prom.close()
    return [
        Series(dict(item.get("metric", {})), tuple((float(t), float(v)) for t, v in item["values"]))
        for item in result or []
        if "values" in item
    ]


def _samples(result: Any) -> list[Sample]:
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return [Sample({}, float(result[1]), float(result[0]))]  # a scalar
    samples = []
    for item in result or []:
        if "value" in item:
            ts, value = item["value"]
            samples.append(Sample(dict(item.get("metric", {})), float(value), float(ts)))
    return samples


def gpu_series(
    metric: str, job_id: int | str | None = None, node: str | None = None, url: str | None = None
) -> list[Sample]:
    """The latest value of one per-GPU agent series (e.g. ``DCGM_FI_PROF_SM_ACTIVE``) for every
    GPU, optionally only one job's GPUs or one node's."""
    if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", metric):
        raise ValueError(f"not a metric name: {metric!r}")
    base = _matchers(**{NODE_LABEL: node})
    if job_id is None:
        return query(f"{metric}{{{base}}}", url)
    parts = [
        f"{metric}{{{','.join(p for p in (base, _matchers(**{label: str(job_id)})) if p)}}}"
        for label in JOB_LABELS
    ]
    samples = query(" or ".join(parts), url)
    # A series matched by the scrape job's own name (label "job") is not a Tessera job's GPU.
    return [s for s in samples if job_of(s) == str(job_id)]


def gpu_utilisation(
    job_id: int | str | None = None, node: str | None = None, url: str | None = None
) -> list[Sample]:
    """The latest GPU utilisation (percent) of each GPU, optionally of one job's GPUs or one node's.

    Without ``job_id``, every GPU's series; with it, the GPUs the agents report that job on.
    """
    return gpu_series(GPU_UTIL, job_id, node, url)


def sm_active(
    job_id: int | str | None = None, node: str | None = None, url: str | None = None
) -> list[Sample]:
    """The share of cycles with a warp on an SM (0..1): closer to real use than utilisation."""
    return gpu_series(SM_ACTIVE, job_id, node, url)


def job_of(sample: Sample | Series) -> str | None:
    if "exported_job" in sample.labels:
        return sample.labels["exported_job"]
    return sample.labels.get("job")
