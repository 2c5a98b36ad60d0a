"""PromQL helpers of the end-to-end tests: the metric names an expression selects (with
Grafana's $variables in it), and the queries of a Grafana dashboard."""

import re

# PromQL words that are not metric names.
PROMQL_WORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "changes",
    "resets",
    "histogram_quantile",
    "abs",
    "ceil",
    "floor",
    "round",
    "clamp",
    "clamp_min",
    "clamp_max",
    "label_replace",
    "label_join",
    "vector",
    "scalar",
    "time",
    "timestamp",
    "absent",
    "absent_over_time",
    "sort",
    "sort_desc",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "quantile_over_time",
    "predict_linear",
    "exp",
    "ln",
    "log2",
    "log10",
    "sqrt",
}


def metric_names(expr):
    """The metric names a PromQL expression (with Grafana's $variables) selects."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # $__rate_interval, $job
    e = re.sub(r"(?<![\w.])\d+(\.\d+)?(e[+-]?\d+)?([a-z]+\b)?", " ", e)  # numbers, durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end() :].lstrip()
        if word in PROMQL_WORDS or (
            rest.startswith("(") and word.islower() and not word.startswith(("vf_", "DCGM_"))
        ):
            continue
        names.add(word)
    return names


def dashboard_queries(dashboard):
    """(where, expr) for every Prometheus query of a Grafana dashboard: panel targets (rows'
    nested panels too), annotation queries and template variable queries."""
    out = []

    def panels(items):
        for p in items:
            for t in p.get("targets") or []:
                if "expr" in t:
                    out.append(("panel %r" % p.get("title"), t["expr"]))
            panels(p.get("panels") or [])

    panels(dashboard.get("panels") or [])
    for a in dashboard.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(("annotation %r" % a["name"], a["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query")
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        out.append(("variable %r" % v["name"], m.group(1) if m else q))
    return out
