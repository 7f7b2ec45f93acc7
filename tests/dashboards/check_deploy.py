#!/usr/bin/env python3
"""Parse and cross-check the deployment files of deploy/ and dashboards/.

usage: check_deploy.py REPO [--gacd PATH] [--write-k8s-rules]

- every YAML file under deploy/ and dashboards/ parses (all documents), and
  dashboards/gac.json is JSON;
- Kubernetes: every object has apiVersion/kind/metadata.name, kustomization
  resources exist, selectors match the pod and Service labels, named ports
  resolve, volumes and mounts match, and the rules in configmap-rules.yaml and
  prometheusrule.yaml are exactly dashboards/gac.rules.yml (--write-k8s-rules
  regenerates both from it);
- compose: bind-mounted files exist, the Prometheus targets and rule path,
  Grafana's datasource URL and dashboard path agree with the services;
- Alertmanager: routes name existing receivers and existing alerts;
- replicas on PostgreSQL (compose.postgresql.yaml, k8s-postgresql/): two or
  more gacd replicas, --store a postgresql:// URI without a password (the
  password comes from a secret through PGPASSWORD), the database service
  exists, each replica is scraped on its own, a PodDisruptionBudget and gRPC
  readiness select the gacd pods;
- with --gacd: gacd starts with the flags of the systemd unit and config, the
  compose file, the Kubernetes Deployment and the Dockerfile (addresses moved
  to loopback ports 0); gacd accepts the flags of the PostgreSQL deployments
  (it gets as far as connecting to the database, moved to a closed loopback
  port); and the Dockerfile's runtime packages cover the libraries the binary
  links (ldd, dpkg).

Exits 0 when everything holds, 1 with one line per problem, 77 (skipped)
when python3-yaml is missing.
"""

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("check_deploy: python3-yaml is missing (apt-get install python3-yaml): skipped")
    sys.exit(77)

problems = []


def problem(msg):
    problems.append(msg)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load(path):
    docs = load_all(path)
    if len(docs) != 1:
        problem(f"{path}: expected one YAML document, got {len(docs)}")
        return {}
    return docs[0]


# ------------------------------------------------------------- k8s rules

K8S_RULES_HEADER = """\
# Generated from dashboards/gac.rules.yml; do not edit. Regenerate with
#   python3 tests/dashboards/check_deploy.py . --write-k8s-rules
# (ctest deploy_files_check fails when this file and the rules differ).
"""


def configmap_rules_text(rules_text):
    body = "".join("    " + line if line.strip() else "\n" for line in rules_text.splitlines(True))
    return (K8S_RULES_HEADER +
            "# Plain Prometheus: mount this ConfigMap as a rule file directory.\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gac-prometheus-rules\n"
            "  labels:\n    app.kubernetes.io/name: gacd\n"
            "data:\n  gac.rules.yml: |\n" + body)


def prometheusrule_text(rules_text):
    # The rules file minus its leading comment block, indented under spec.
    lines = rules_text.splitlines(True)
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join("  " + line if line.strip() else "\n" for line in lines[start:])
    return (K8S_RULES_HEADER +
            "# Prometheus Operator: the same rules as a PrometheusRule. Your Prometheus\n"
            "# resource's ruleSelector must match these labels.\n"
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: gac\n"
            "  labels:\n    app.kubernetes.io/name: gacd\n"
            "spec:\n" + body)


# -------------------------------------------------------------- checks

def check_parse(repo):
    for path in sorted(glob.glob(f"{repo}/deploy/**/*.y*ml", recursive=True) +
                       glob.glob(f"{repo}/dashboards/**/*.y*ml", recursive=True)):
        try:
            load_all(path)
        except yaml.YAMLError as e:
            problem(f"{path}: does not parse: {e}")
    try:
        with open(f"{repo}/dashboards/gac.json") as f:
            json.load(f)
    except (OSError, ValueError) as e:
        problem(f"dashboards/gac.json: {e}")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def kustomize_objects(k8s, where):
    """The objects of a kustomization's resources, by (kind, name)."""
    kust = load(f"{k8s}/kustomization.yaml")
    objects = {}
    for res in kust.get("resources", []):
        path = f"{k8s}/{res}"
        if not os.path.exists(path):
            problem(f"{where}kustomization.yaml: resource {res} does not exist")
            continue
        for doc in load_all(path):
            kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
            if not doc.get("apiVersion") or not kind or not name:
                problem(f"{where}{res}: object without apiVersion, kind or metadata.name")
                continue
            objects[(kind, name)] = doc
    return objects


def check_k8s(repo):
    k8s = f"{repo}/deploy/k8s"
    objects = kustomize_objects(k8s, "")
    dep = objects.get(("Deployment", "gacd"))
    svc = objects.get(("Service", "gacd"))
    sm = objects.get(("ServiceMonitor", "gacd"))
    if not dep or not svc or not sm:
        problem("k8s: expected Deployment, Service and ServiceMonitor named gacd")
        return
    spec = dep["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    if not matches(spec["selector"]["matchLabels"], pod_labels):
        problem("deployment.yaml: selector does not match the pod labels")
    if not matches(svc["spec"]["selector"], pod_labels):
        problem("service.yaml: selector does not match the pod labels")
    if not matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]):
        problem("servicemonitor.yaml: selector does not match the Service labels")
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for p in svc["spec"]["ports"]:
        if p["targetPort"] not in port_names:
            problem(f"service.yaml: targetPort {p['targetPort']} is no container port")
    svc_ports = {p["name"] for p in svc["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        if ep["port"] not in svc_ports:
            problem(f"servicemonitor.yaml: port {ep['port']} is no Service port")
    args = dict(a[2:].split("=", 1) for a in container["args"] if "=" in a)
    for flag, name in (("listen", "grpc"), ("http-listen", "metrics")):
        if not args.get(flag, "").endswith(f":{port_names.get(name)}"):
            problem(f"deployment.yaml: --{flag} does not use the container port {name}")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for m in mounts.values():
        if m["name"] not in volumes:
            problem(f"deployment.yaml: volumeMount {m['name']} has no volume")
    if sqlite_dir(args) not in mounts:
        problem("deployment.yaml: --store=sqlite:DIR is not a mounted volume")
    token_dir = os.path.dirname(args.get("token-file", ""))
    if token_dir not in mounts or "secret" not in volumes[mounts[token_dir]["name"]]:
        problem("deployment.yaml: --token-file is not in a mounted secret")
    claim = volumes.get("data", {}).get("persistentVolumeClaim", {}).get("claimName")
    if ("PersistentVolumeClaim", claim) not in objects:
        problem(f"deployment.yaml: claim {claim} is not defined")
    for probe in ("readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("grpc", {}).get("port")
        if port != port_names.get("grpc"):
            problem(f"deployment.yaml: {probe} does not probe the gRPC port")

    # The rules: byte-identical to the generated files, equal as data.
    with open(f"{repo}/dashboards/gac.rules.yml") as f:
        rules_text = f.read()
    rules = yaml.safe_load(rules_text)
    for name, text in (("configmap-rules.yaml", configmap_rules_text(rules_text)),
                       ("prometheusrule.yaml", prometheusrule_text(rules_text))):
        with open(f"{k8s}/{name}") as f:
            if f.read() != text:
                problem(f"deploy/k8s/{name} differs from dashboards/gac.rules.yml "
                        "(regenerate: python3 tests/dashboards/check_deploy.py . --write-k8s-rules)")
    cm = objects.get(("ConfigMap", "gac-prometheus-rules"))
    if not cm or yaml.safe_load(cm["data"]["gac.rules.yml"]) != rules:
        problem("configmap-rules.yaml: the rules differ from dashboards/gac.rules.yml")
    pr = objects.get(("PrometheusRule", "gac"))
    if not pr or pr["spec"] != rules:
        problem("prometheusrule.yaml: the rules differ from dashboards/gac.rules.yml")


def sqlite_dir(flags):
    """The data directory of --store=sqlite:DIR, or None."""
    store = flags.get("store", "")
    return store[len("sqlite:"):] if store.startswith("sqlite:") else None


def compose_flags(command):
    return dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in command)


def check_compose(repo):
    deploy = f"{repo}/deploy"
    compose = load(f"{deploy}/compose.yaml")
    services = compose.get("services", {})
    missing = [name for name in ("gacd", "prometheus", "alertmanager", "grafana") if name not in services]
    if missing:
        problem(f"compose.yaml: no service {', '.join(missing)}")
        return
    build = services["gacd"]["build"]
    context = os.path.normpath(f"{deploy}/{build['context']}")
    if not os.path.exists(f"{context}/{build['dockerfile']}"):
        problem("compose.yaml: the gacd Dockerfile is not in the build context")
    if not os.path.exists(f"{context}/CMakeLists.txt"):
        problem("compose.yaml: the build context is not the repository root")
    mounts = {}
    for svc_name, svc in services.items():
        for vol in svc.get("volumes", []):
            src, dst = vol.split(":")[:2]
            if src.startswith("."):
                if not os.path.exists(os.path.normpath(f"{deploy}/{src}")):
                    problem(f"compose.yaml: {svc_name} mounts {src}, which does not exist")
                mounts[(svc_name, dst)] = os.path.normpath(f"{deploy}/{src}")
    for name, secret in compose.get("secrets", {}).items():
        if not os.path.exists(f"{deploy}/{secret['file']}.example"):
            problem(f"compose.yaml: secret {name} has no {secret['file']}.example")

    gacd_flags = compose_flags(services["gacd"]["command"])
    metrics_port = gacd_flags.get("http-listen", "").rsplit(":", 1)[-1]
    if f"/run/secrets/{services['gacd']['secrets'][0]}" != gacd_flags.get("token-file"):
        problem("compose.yaml: gacd --token-file is not its secret")

    # Prometheus: its config and rules are the mounted ones; it scrapes gacd.
    prom_cfg_path = mounts.get(("prometheus", "/etc/prometheus/prometheus.yml"))
    if prom_cfg_path != os.path.normpath(f"{deploy}/prometheus.yml"):
        problem("compose.yaml: Prometheus does not use deploy/prometheus.yml")
        return
    prom = load(prom_cfg_path)
    rule_dirs = {os.path.dirname(os.path.join("/etc/prometheus", g)) for g in prom.get("rule_files", [])}
    rules_mounted = [dst for (svc, dst), src in mounts.items()
                     if svc == "prometheus" and src.endswith("dashboards/gac.rules.yml")]
    if not rules_mounted or os.path.dirname(rules_mounted[0]) not in rule_dirs:
        problem("compose.yaml/prometheus.yml: dashboards/gac.rules.yml is not mounted where rule_files look")
    jobs = {j["job_name"]: j for j in prom.get("scrape_configs", [])}
    gacd_targets = [t for sc in jobs.get("gacd", {}).get("static_configs", []) for t in sc["targets"]]
    if f"gacd:{metrics_port}" not in gacd_targets:
        problem(f"prometheus.yml: job gacd does not scrape gacd:{metrics_port}")
    am_targets = [t for am in prom.get("alerting", {}).get("alertmanagers", [])
                  for sc in am.get("static_configs", []) for t in sc["targets"]]
    if not any(t.split(":")[0] in services for t in am_targets):
        problem("prometheus.yml: no alertmanager target is a compose service")

    # Grafana: the datasource is the Prometheus service; the provider reads
    # the directory gac.json is mounted into.
    prov = mounts.get(("grafana", "/etc/grafana/provisioning"))
    if not prov:
        problem("compose.yaml: Grafana provisioning is not mounted")
        return
    for path in glob.glob(f"{prov}/datasources/*.y*ml"):
        for ds in load(path).get("datasources", []):
            host = re.sub(r"^https?://", "", ds.get("url", "")).split(":")[0]
            if ds.get("type") != "prometheus" or host not in services:
                problem(f"{path}: datasource {ds.get('name')} is not the compose Prometheus")
    dash_dst = [dst for (svc, dst), src in mounts.items() if svc == "grafana" and src.endswith("gac.json")]
    for path in glob.glob(f"{prov}/dashboards/*.y*ml"):
        for p in load(path).get("providers", []):
            if not dash_dst or os.path.dirname(dash_dst[0]) != p["options"]["path"]:
                problem(f"{path}: provider {p['name']} does not read the mounted dashboard")
    home = services["grafana"].get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home and home not in dash_dst:
        problem("compose.yaml: Grafana's home dashboard path is not the mounted gac.json")


def check_alertmanager(repo):
    am = load(f"{repo}/deploy/alertmanager.yml")
    rules = yaml.safe_load(open(f"{repo}/dashboards/gac.rules.yml"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    receivers = {r["name"] for r in am.get("receivers", [])}

    def walk(route):
        if route.get("receiver") not in receivers:
            problem(f"alertmanager.yml: receiver {route.get('receiver')} is not defined")
        for m in route.get("matchers", []):
            name, op, value = re.match(r'\s*(\w+)\s*(=~|!=|!~|=)\s*"?([^"]*)"?\s*$', m).groups()
            if name == "alertname":
                hit = [a for a in alerts if (re.fullmatch(value, a) if op == "=~" else a == value)]
                if op in ("=", "=~") and not hit:
                    problem(f"alertmanager.yml: matcher {m} matches no alert of gac.rules.yml")
        for r in route.get("routes", []):
            walk(r)

    walk(am.get("route", {}))
    for rule in am.get("inhibit_rules", []):
        for key in ("source_matchers", "target_matchers"):
            for m in rule.get(key, []):
                name, op, value = re.match(r'\s*(\w+)\s*(=~|!=|!~|=)\s*"?([^"]*)"?\s*$', m).groups()
                if name == "alertname" and not any(
                        re.fullmatch(value, a) if op == "=~" else a == value for a in alerts):
                    problem(f"alertmanager.yml: inhibit matcher {m} matches no alert")


# ------------------------------------------------------- PostgreSQL replicas

def check_store_uri(uri, what):
    """A postgresql:// URI whose password does not appear in the flags."""
    m = re.match(r"postgres(?:ql)?://([^@/]*)@([^/:?]+)(?::(\d+))?/([^?]+)", uri or "")
    if not m:
        problem(f"{what}: --store is not a postgresql://USER@HOST[:PORT]/DB URI: {uri!r}")
        return None
    if ":" in m.group(1):
        problem(f"{what}: --store carries a password; pass it through PGPASSWORD from a secret")
    return m.group(2)


def check_k8s_postgresql(repo):
    objects = kustomize_objects(f"{repo}/deploy/k8s-postgresql", "k8s-postgresql/")
    dep = objects.get(("Deployment", "gacd"))
    pdb = objects.get(("PodDisruptionBudget", "gacd"))
    svc = objects.get(("Service", "gacd"))
    sm = objects.get(("ServiceMonitor", "gacd"))
    if not dep or not pdb or not svc or not sm:
        problem("k8s-postgresql: expected Deployment, PodDisruptionBudget, Service and ServiceMonitor named gacd")
        return
    spec = dep["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    replicas = spec.get("replicas", 1)
    if replicas < 2:
        problem("k8s-postgresql/deployment.yaml: fewer than two replicas")
    if spec.get("strategy", {}).get("type", "RollingUpdate") != "RollingUpdate":
        problem("k8s-postgresql/deployment.yaml: replicas sharing a database roll, they are not recreated")
    if not matches(spec["selector"]["matchLabels"], pod_labels):
        problem("k8s-postgresql/deployment.yaml: selector does not match the pod labels")
    if not matches(pdb["spec"]["selector"]["matchLabels"], pod_labels):
        problem("k8s-postgresql/pdb.yaml: selector does not match the gacd pods")
    max_unavailable = pdb["spec"].get("maxUnavailable")
    min_available = pdb["spec"].get("minAvailable")
    if max_unavailable is None and min_available is None:
        problem("k8s-postgresql/pdb.yaml: neither maxUnavailable nor minAvailable")
    elif (max_unavailable is not None and max_unavailable >= replicas) or \
            (min_available is not None and (min_available < 1 or min_available >= replicas)):
        problem("k8s-postgresql/pdb.yaml: the budget lets every replica go, or none")
    for s in [o for (kind, _), o in objects.items() if kind == "Service" and o["metadata"]["name"].startswith("gacd")]:
        if not matches(s["spec"]["selector"], pod_labels):
            problem(f"k8s-postgresql/service.yaml: {s['metadata']['name']} does not select the gacd pods")
    if not matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]):
        problem("k8s-postgresql/servicemonitor.yaml: selector does not match the Service labels")
    container = spec["template"]["spec"]["containers"][0]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        if container.get(probe, {}).get("grpc", {}).get("port") != port_names.get("grpc"):
            problem(f"k8s-postgresql/deployment.yaml: {probe} does not probe the gRPC port (grpc.health.v1)")
    args = dict(a[2:].split("=", 1) for a in container["args"] if "=" in a)
    host = check_store_uri(args.get("store"), "k8s-postgresql/deployment.yaml")
    env = {e["name"]: e for e in container.get("env", [])}
    if "secretKeyRef" not in env.get("PGPASSWORD", {}).get("valueFrom", {}):
        problem("k8s-postgresql/deployment.yaml: PGPASSWORD does not come from a secret")
    if "data-dir" in args or "db" in args or "metrics-listen" in args:
        problem("k8s-postgresql/deployment.yaml: --data-dir/--db/--metrics-listen are deprecated")
    sts = objects.get(("StatefulSet", host))
    if ("Service", host) in objects and not sts:
        problem(f"k8s-postgresql: Service {host} has no StatefulSet")
    if sts:
        db_env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        ref = db_env.get("POSTGRES_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {})
        if ref != env.get("PGPASSWORD", {}).get("valueFrom", {}).get("secretKeyRef"):
            problem("k8s-postgresql/postgres.yaml: the database password is not gacd's secret")
        if not matches(objects[("Service", host)]["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"]):
            problem(f"k8s-postgresql/postgres.yaml: Service {host} does not select the database pod")


def check_compose_postgresql(repo):
    deploy = f"{repo}/deploy"
    compose = load(f"{deploy}/compose.postgresql.yaml")
    services = compose.get("services", {})
    missing = [n for n in ("postgres", "gacd", "prometheus") if n not in services]
    if missing:
        problem(f"compose.postgresql.yaml: no service {', '.join(missing)}")
        return
    gacd = services["gacd"]
    if gacd.get("deploy", {}).get("replicas", 1) < 2:
        problem("compose.postgresql.yaml: fewer than two gacd replicas")
    flags = compose_flags(gacd["command"])
    host = check_store_uri(flags.get("store"), "compose.postgresql.yaml")
    if host and host not in services:
        problem(f"compose.postgresql.yaml: --store names {host}, which is no service")
    if "PGPASSWORD" not in gacd.get("environment", {}):
        problem("compose.postgresql.yaml: gacd gets no PGPASSWORD")
    if gacd.get("depends_on", {}).get(host, {}).get("condition") != "service_healthy":
        problem("compose.postgresql.yaml: gacd does not wait for a healthy database")
    for svc_name, svc in services.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith(".") and not os.path.exists(os.path.normpath(f"{deploy}/{src}")):
                problem(f"compose.postgresql.yaml: {svc_name} mounts {src}, which does not exist")
    prom_src = [v.split(":")[0] for v in services["prometheus"].get("volumes", [])
                if v.split(":")[1] == "/etc/prometheus/prometheus.yml"]
    if not prom_src:
        problem("compose.postgresql.yaml: Prometheus has no configuration mounted")
        return
    prom = load(os.path.normpath(f"{deploy}/{prom_src[0]}"))
    jobs = {j["job_name"]: j for j in prom.get("scrape_configs", [])}
    metrics_port = int(flags.get("http-listen", "").rsplit(":", 1)[-1] or 0)
    sd = [d for d in jobs.get("gacd", {}).get("dns_sd_configs", []) if "gacd" in d.get("names", [])]
    if not sd or sd[0].get("port") != metrics_port:
        problem(f"{prom_src[0]}: job gacd does not find every replica (dns_sd_configs gacd, port {metrics_port})")


def gacd_accepts(gacd, args, what):
    """gacd with `args` (the store moved to a closed loopback port) gets as
    far as connecting to the database: exit 2 with the store's UNAVAILABLE."""
    with tempfile.TemporaryDirectory() as tmp:
        tokens = f"{tmp}/tokens"
        with open(tokens, "w") as f:
            f.write("check " + "0123456789abcdef0123 write *\n")
        os.chmod(tokens, 0o600)  # gacd refuses a token file others can read
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        store = re.sub(r"@[^/]+/", f"@127.0.0.1:{closed}/", dict(
            a[2:].split("=", 1) for a in args if "=" in a).get("store", ""))
        override = {"listen": "127.0.0.1:0", "http-listen": "127.0.0.1:0", "token-file": tokens,
                    "store": store}
        argv = [gacd] + [a for a in args if a.split("=", 1)[0][2:] not in override]
        argv += [f"--{k}={v}" for k, v in override.items()]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 2 or "cannot start: UNAVAILABLE" not in text:
            problem(f"{what}: gacd does not accept the flags: {text} ({shlex.join(argv)})")
        for line in text.splitlines():
            if "deprecated" in line:  # deployments use the current flag names
                problem(f"{what}: {line.strip()}")


# ---------------------------------------------------------------- gacd

def gacd_starts(gacd, args, what):
    """Starts gacd with `args` moved to loopback ports 0, waits until ready."""
    with tempfile.TemporaryDirectory() as tmp:
        tokens = f"{tmp}/tokens"
        with open(tokens, "w") as f:
            f.write("check " + "0123456789abcdef0123 write *\n")
        os.chmod(tokens, 0o600)  # gacd refuses a token file others can read
        override = {"listen": "127.0.0.1:0", "http-listen": "127.0.0.1:0", "store": f"sqlite:{tmp}",
                    "token-file": tokens, "ready-file": f"{tmp}/ready"}
        argv = [gacd] + [a for a in args if a.split("=", 1)[0][2:] not in override]
        argv += [f"--{k}={v}" for k, v in override.items()]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 20
            while time.time() < deadline:
                if os.path.exists(f"{tmp}/ready") and "grpc=" in open(f"{tmp}/ready").read():
                    break
                if proc.poll() is not None:
                    problem(f"{what}: gacd exits: {proc.stdout.read().strip()} ({shlex.join(argv)})")
                    return
                time.sleep(0.05)
            else:
                problem(f"{what}: gacd not ready after 20 s")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log = proc.stdout.read()
            for line in log.splitlines():
                if "deprecated" in line:  # deployments use the current flag names
                    problem(f"{what}: {line.strip()}")


def check_gacd(repo, gacd):
    deploy = f"{repo}/deploy"
    # systemd: the ExecStart flags, with the config file of the unit.
    unit = open(f"{deploy}/systemd/gacd.service").read()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
    if exec_start[0] != "/usr/local/bin/gacd" or "--config=/etc/gacd/gacd.conf" not in exec_start:
        problem("gacd.service: ExecStart is not /usr/local/bin/gacd --config=/etc/gacd/gacd.conf ...")
    args = [a.replace("/etc/gacd/gacd.conf", f"{deploy}/systemd/gacd.conf") for a in exec_start[1:]]
    gacd_starts(gacd, args, "systemd gacd.conf")
    gacd_starts(gacd, load(f"{deploy}/compose.yaml")["services"]["gacd"]["command"], "compose.yaml")
    dep = [d for d in load_all(f"{deploy}/k8s/deployment.yaml") if d["kind"] == "Deployment"][0]
    gacd_starts(gacd, dep["spec"]["template"]["spec"]["containers"][0]["args"], "k8s deployment.yaml")
    dockerfile = open(f"{deploy}/Dockerfile").read()
    cmd = json.loads(re.search(r"^CMD (\[.*?\])", dockerfile, re.M | re.S).group(1).replace("\\\n", ""))
    gacd_starts(gacd, cmd, "Dockerfile CMD")
    gacd_accepts(gacd, load(f"{deploy}/compose.postgresql.yaml")["services"]["gacd"]["command"],
                 "compose.postgresql.yaml")
    dep = [d for d in load_all(f"{deploy}/k8s-postgresql/deployment.yaml") if d["kind"] == "Deployment"][0]
    gacd_accepts(gacd, dep["spec"]["template"]["spec"]["containers"][0]["args"], "k8s-postgresql deployment.yaml")

    # The runtime stage installs (directly or through their dependencies) the
    # package of every library gacd links.
    try:
        ldd = subprocess.run(["ldd", gacd], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return
    runtime = dockerfile.split("FROM debian:12-slim", 1)[1]
    listed = re.search(r"install -y --no-install-recommends(.*?)&&", runtime, re.S).group(1)
    listed = listed.replace("\\", " ").split()
    try:
        deps = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + listed,
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return
    available = set(listed) | {l.strip() for l in deps.splitlines() if l and not l.startswith(" ")}
    available |= {l.split(":", 1)[1].strip() for l in deps.splitlines() if "Depends:" in l}
    libs = re.findall(r"=> (/\S+)", ldd)
    owners = {}
    out = subprocess.run(["dpkg", "-S"] + sorted({os.path.realpath(l) for l in libs} | set(libs)),
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        for p in path.split(", "):
            owners[p.strip()] = pkg.split(":", 1)[0]
    for lib in libs:
        pkg = owners.get(os.path.realpath(lib)) or owners.get(lib)
        if pkg and pkg not in available:
            problem(f"Dockerfile: runtime stage lacks {pkg} (for {lib})")


def check_metrics_documented(repo):
    """Every metric gacd registers is in docs/OPERATIONS.md's table: those
    server/src/metrics.cc names (also in server/src/metrics.h's list) and the
    gauges of the record's fields (metrics.cc's kFieldGauges, each a
    {"field", "gac_name"} row) and of their early medians (kEarlyMedianGauges,
    rows {"field", "gac_name", "help"}). Names may hold digits (gac_kl_k3_nats)."""
    source = open(f"{repo}/server/src/metrics.cc").read()
    names = sorted(set(re.findall(r'Family\(r, "(gac_[a-z0-9_]+)"', source)))
    if not names:
        problem("server/src/metrics.cc: no metric names found")
    field_gauges = sorted(set(re.findall(r'\{"[a-z0-9_]+", "(gac_[a-z0-9_]+)"[,}]', source)))
    if not field_gauges:
        problem("server/src/metrics.cc: no field gauges found")
    docs = open(f"{repo}/docs/OPERATIONS.md").read()
    header = open(f"{repo}/server/src/metrics.h").read()
    for name in names + field_gauges:
        if f"`{name}`" not in docs:
            problem(f"docs/OPERATIONS.md: metric {name} is not in the metrics table")
    for name in names:
        if not re.search(rf"\b{name}\b", header):
            problem(f"server/src/metrics.h: metric {name} is not in the list of series")


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    repo = os.path.abspath(args[0])
    gacd = args[args.index("--gacd") + 1] if "--gacd" in args else None
    if "--write-k8s-rules" in args:
        rules_text = open(f"{repo}/dashboards/gac.rules.yml").read()
        with open(f"{repo}/deploy/k8s/configmap-rules.yaml", "w") as f:
            f.write(configmap_rules_text(rules_text))
        with open(f"{repo}/deploy/k8s/prometheusrule.yaml", "w") as f:
            f.write(prometheusrule_text(rules_text))
    check_parse(repo)
    if not problems:  # the other checks read the parsed files
        check_k8s(repo)
        check_compose(repo)
        check_k8s_postgresql(repo)
        check_compose_postgresql(repo)
        check_alertmanager(repo)
        check_metrics_documented(repo)
        if gacd:
            check_gacd(repo, gacd)
    for p in problems:
        print("check_deploy:", p)
    if not problems:
        print("check_deploy: deploy/ and dashboards/ are consistent")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
