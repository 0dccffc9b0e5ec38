"""``verl plugins``: what is installed, what it provides, and whether it can run on this machine.

Lists every plugin of entry-point group ``verl.plugins`` (name, distribution, version, module,
plugin API, provided names per kind), every provided name with "usable here: yes/no" and the
reason (platform probes' answers; engine devices against the platform this machine resolves
to, by the rule of config load; a name two plugins claim: not usable, "conflict: provided by A and
B"), plugins that failed to load with their errors, plugins disabled by ``VERL_PLUGINS`` and
name conflicts. Exit status 1 when any plugin failed or conflicts, else 0.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "list installed plugins, what they provide and whether it is usable on this machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--json``."""
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def run(args: argparse.Namespace) -> int:
    """Print the report; return 1 if any plugin failed to load or two plugins claim one name."""
    report = build_report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 1 if report["failures"] or report["conflicts"] else 0


def build_report() -> dict[str, Any]:
    """Everything ``verl plugins`` shows, as JSON-ready data (see the keys below)."""
    from verl.plugins import (
        ENTRY_POINT_GROUP,
        KINDS,
        PLUGIN_API_VERSION,
        PluginError,
        get_plugin_manager,
        probe_platforms,
        resolve_platform,
    )

    pm = get_plugin_manager()
    claims = {kind: pm.distinct_claims(kind) for kind in KINDS}  # collect first: hook failures show up here
    conflicts = {kind: pm.conflicts(kind) for kind in KINDS}

    answers = {a.name: a for a in probe_platforms(pm)}  # a platform name claimed twice is not probed
    try:
        current = resolve_platform(plugin_manager=pm)
        platform = {"name": current.name, "device_type": current.device_type, "error": None}
    except Exception as exc:  # a report, not a run: show why no platform resolves instead of crashing
        current = None
        text = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
        platform = {"name": None, "device_type": None, "error": text}

    from verl.plugins.specs import backend_unavailable

    def usable(kind: str, spec: Any) -> tuple[bool | None, str]:
        clash = conflicts[kind].get(spec.name)
        if clash is not None:  # the lookups refuse this name: list it as what it is, not as usable
            who = " and ".join(info.distribution or info.name for info in clash)
            return False, f"conflict: provided by {who}"
        if kind == "platform":
            answer = answers[spec.name]
            return answer.available, answer.reason
        if not hasattr(spec, "devices"):
            return True, "device-independent"
        missing = backend_unavailable(spec)
        if missing is not None:
            return False, missing
        return _engine_usable(kind, spec, current, platform["error"], answers)

    specs = {}
    for kind in KINDS:
        rows = []
        for claim in claims[kind]:
            ok, why = usable(kind, claim.spec)
            row = {"name": claim.spec.name, "plugin": claim.plugin.name, "distribution": claim.plugin.distribution}
            row.update({"usable": ok, "reason": why})
            for field in ("devices", "capabilities", "accelerator"):
                if hasattr(claim.spec, field):
                    value = getattr(claim.spec, field)
                    row[field] = sorted(value) if isinstance(value, frozenset) else value
            rows.append(row)
        specs[kind] = rows

    return {
        "entry_point_group": ENTRY_POINT_GROUP,
        "api_version": list(PLUGIN_API_VERSION),
        "allow_list": pm.allow_list.raw,
        "plugins": [
            {
                **_info(info),
                "api_version": list(info.api_version) if info.api_version else None,
                "provides": {k: list(v) for k, v in pm.provides(info).items()},
            }
            for info in pm.plugins
        ],
        "platform": platform,
        "specs": specs,
        "failures": [{**_info(f.plugin), "stage": f.stage, "error": f.error} for f in pm.failures],
        "disabled": [_info(info) for info in pm.disabled],
        "conflicts": [
            {"kind": kind, "name": name, "providers": [_info(i) for i in infos]}
            for kind, by_name in conflicts.items()
            for name, infos in by_name.items()
        ],
    }


def _engine_usable(kind: str, spec: Any, current: Any, error: str | None, answers: dict) -> tuple[bool | None, str]:
    """Usable column of an engine: the rule of config load (:func:`verl.plugins.selection.device_mismatch`)
    against the platform this machine resolves to; when it does not match, a usable platform that does."""
    from verl.plugins.selection import device_mismatch

    if current is None:
        first = (error or "").splitlines()[0].rstrip(":") if error else ""  # the rest: 'Platform of this machine'
        return None, f"unknown: no platform resolved ({first}; see 'Platform of this machine' above)"
    if device_mismatch(kind, spec, current.name, current.device_type) is None:
        return True, f"runs on {current.name}"
    others = [
        name for name, a in answers.items() if a.available and device_mismatch(kind, spec, name, a.device_type) is None
    ]
    hint = f"; usable with trainer.device={others[0]}" if others else ""
    kind_of = f" (device type {current.device_type})" if current.device_type != current.name else ""
    return False, f"needs {' or '.join(spec.devices)}; this machine resolves to {current.name}{kind_of}{hint}"


def _info(info: Any) -> dict[str, Any]:
    return {"name": info.name, "distribution": info.distribution, "version": info.version, "module": info.module}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip() for r in [header, *rows]
    ]


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def format_report(report: dict[str, Any]) -> str:
    """Plain-text tables of :func:`build_report`'s data."""
    major, minor = report["api_version"]
    allow = "unset (all plugins)" if report["allow_list"] is None else repr(report["allow_list"])
    out = [f"verl plugins: entry-point group {report['entry_point_group']!r}, plugin API {major}.{minor}, "
           f"VERL_PLUGINS {allow}", ""]  # fmt: skip
    rows = [
        [
            p["name"], p["distribution"] or "-", p["version"] or "-", p["module"],
            ".".join(map(str, p["api_version"])) if p["api_version"] else "-",
            "; ".join(f"{kind}: {', '.join(names)}" for kind, names in p["provides"].items()) or "nothing",
        ]
        for p in report["plugins"]
    ]  # fmt: skip
    out += _table(["PLUGIN", "DISTRIBUTION", "VERSION", "MODULE", "API", "PROVIDES"], rows)

    platform = report["platform"]
    out.append("")
    if platform["error"] is None:
        out.append(f"Platform of this machine (automatic choice): {platform['name']}")
    else:
        out.append("Platform of this machine: not resolved")
        out += [f"  {line}" for line in platform["error"].splitlines()]

    for kind, rows in report["specs"].items():
        out.append("")
        if not rows:
            out.append(f"{kind}: none installed")
            continue
        out.append(f"{kind}:")
        table = [[r["name"], r["plugin"], r["distribution"] or "-", _yes_no(r["usable"]), r["reason"]] for r in rows]
        out += ["  " + line for line in _table(["NAME", "PLUGIN", "DISTRIBUTION", "USABLE", "WHY"], table)]

    if report["failures"]:
        out += ["", "Failed plugins:"]
        for f in report["failures"]:
            who = " ".join(x for x in (f["distribution"], f["version"]) if x) or "unknown distribution"
            out.append(f"  - {f['name']} ({who}, module {f['module'] or '-'}) [{f['stage']}]: {f['error']}")
    if report["disabled"]:
        out += ["", f"Not loaded (VERL_PLUGINS={report['allow_list']!r} does not list them):"]
        out += [
            f"  - {d['name']} ({d['distribution'] or '-'} {d['version'] or ''})".rstrip() for d in report["disabled"]
        ]
    if report["conflicts"]:
        out += ["", "Conflicts (these names cannot be used until all but one provider is removed):"]
        for c in report["conflicts"]:
            who = "; ".join(f"{p['name']} ({p['distribution'] or '-'})" for p in c["providers"])
            out.append(f"  - {c['kind']} {c['name']!r}: {who}")
    return "\n".join(out)
