"""``vidlake report <version>``: a version's plan quality report (``quality.json``).

The table shows the headline numbers against the recipe's thresholds, each phase's
share deviation, each key's autocorrelation (lag 1 and the largest beyond the batch
lag) and the epochs per (stream, bucket); ``--json`` prints the whole report
(``repeated_in_step``, ``max_share_deviation``, ``max_autocorr_beyond_batch``, …).
"""

from __future__ import annotations

from typing import Any

from service.cli_common import JsonOpt, TokenOpt, UrlOpt, emit, new_table, open_client, out

__all__ = ["COMMANDS", "report"]


def report(
    version: int, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Plan quality of a version: stream shares vs targets over sliding windows, samples
    repeated within a step, autocorrelation by lag, epochs per stream and bucket."""
    with open_client(url, token) as client:
        emit(client.report(version), as_json, _render)


def _render(data: dict[str, Any]) -> None:
    out.print(_headline(data))
    phases = new_table("phase", "steps", "unit", "max |dev|", "p99 |dev|", title="stream shares")
    for p in data["phases"]:
        phases.add_row(
            p["name"],
            str(p["steps"]),
            p["unit"],
            f"{p['max_abs_deviation']:.4f}",
            f"{p['p99_abs_deviation']:.4f}",
        )
    out.print(phases)
    out.print(_autocorr_table(data))
    epochs = new_table("stream", "bucket", "samples", "draws", "epochs", title="epochs")
    for e in data["epochs"]:
        epochs.add_row(
            e["stream"], e["bucket"], str(e["samples"]), str(e["draws"]), f"{e['epochs']:.2f}"
        )
    out.print(epochs)


def _headline(data: dict[str, Any]) -> str:
    limits = data["thresholds"]

    def limit(name: str) -> str:
        value = limits.get(name)
        return f" (threshold {value:g})" if value is not None else ""

    verdict = "passed" if data["passed"] else "FAILED"
    return (
        f"{verdict}: repeated_in_step {data['repeated_in_step']}, "
        f"max_share_deviation {data['max_share_deviation']:.4f}"
        f"{limit('max_share_deviation')} over windows of {data['window_steps']} steps, "
        f"max_autocorr_beyond_batch {data['max_autocorr_beyond_batch']:.4f}"
        f"{limit('max_autocorr_beyond_batch')} beyond lag {data['batch_lag']}"
    )


def _autocorr_table(data: dict[str, Any]) -> Any:
    lags = data["autocorr"]["lags"]
    batch = data["batch_lag"]
    table = new_table("key", "acf lag 1", f"max |acf| beyond lag {batch}", title="autocorrelation")
    for key, series in data["autocorr"]["series"].items():
        beyond = [abs(v) for lag, v in zip(lags, series, strict=True) if lag > batch]
        first = f"{series[0]:.4f}" if series else "-"
        table.add_row(key, first, f"{max(beyond):.4f}" if beyond else "-")
    return table


COMMANDS = (report,)
