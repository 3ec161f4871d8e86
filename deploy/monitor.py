"""Read a process's Prometheus endpoint into {sample: value} (used by the launcher and tests)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(host: str, port: int, timeout_s: float = 2.0) -> dict[str, float]:
    """'name{label="v"}' -> value; {} if the endpoint does not answer (process starting/gone)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def total(samples: dict[str, float], name: str) -> float:
    """Sum of a metric over all its label sets (e.g. episodes over modes)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))
