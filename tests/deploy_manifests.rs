//! The Kubernetes deployment bundle (`deploy/kubernetes/`, `deploy/Dockerfile`), checked
//! offline, without a cluster:
//! - `scripts/validate-manifests` (kubernetes-validate, strict: every object against the
//!   schemas of the Kubernetes API) passes. The validator missing is a failure, not a skip:
//!   `scripts/install-deps --for test` installs it.
//! - What those schemas cannot tell, checked here on the parsed YAML with glidefs' own code:
//!   the custom resources the validator has no schema for (VolumeSnapshotClass,
//!   VolumeSnapshot), enum values, references between objects (Secrets, ConfigMap keys,
//!   service accounts, roles, StorageClasses, data sources), the driver name
//!   ([`glidefs_csi::DRIVER_NAME`]), the StorageClass parameters ([`Params::parse`]), the
//!   daemon's TOML ([`Config::parse`]), every `glidefs` command line and probe (clap), the
//!   files those name (mounted from the right ConfigMap or Secret key), the sockets the
//!   containers share, and the kubelet registration path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use glidefs::cli::args::{Cli, Command as CliCommand, CsiArgs, CsiMode, ServeArgs, VolumeCommand};
use glidefs::daemon::config::Config;
use glidefs_csi::params::Params;
use glidefs_csi::DRIVER_NAME;
use serde::Deserialize;
use serde_json::Value;

/// The namespace of every namespaced object outside `examples/`.
const NAMESPACE: &str = "glidefs-system";
/// The image of every container that runs the `glidefs` binary.
const GLIDEFS_IMAGE: &str = "ghcr.io/glidefs/glidefs:";
/// What `$(NODE_IP)`-like references stand for when a command line is parsed.
const PLACEHOLDER_IP: &str = "192.0.2.10";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// One object of the bundle and the file it is in (relative to the repository root).
struct Obj {
    file: String,
    v: Value,
}

impl Obj {
    fn kind(&self) -> &str {
        self.v["kind"].as_str().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.v["metadata"]["name"].as_str().unwrap_or("")
    }

    fn namespace(&self) -> Option<&str> {
        self.v["metadata"]["namespace"].as_str()
    }

    fn id(&self) -> String {
        format!("{}/{} ({})", self.kind(), self.name(), self.file)
    }

    fn example(&self) -> bool {
        self.file.starts_with("deploy/kubernetes/examples/")
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// Every object of every YAML file under `deploy/kubernetes`.
fn bundle() -> Vec<Obj> {
    let root = root();
    let mut files = Vec::new();
    yaml_files(&root.join("deploy/kubernetes"), &mut files);
    let mut objs = Vec::new();
    for path in files {
        let file = path
            .strip_prefix(&root)
            .expect("under the root")
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut found = 0;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
            if v.is_null() {
                continue;
            }
            assert!(v.is_object(), "{file}: a document that is not a mapping");
            found += 1;
            objs.push(Obj {
                file: file.clone(),
                v,
            });
        }
        assert!(found > 0, "{file}: no object");
    }
    assert!(objs.len() > 10, "the bundle has {} objects", objs.len());
    objs
}

fn of_kind<'a>(b: &'a [Obj], kind: &'a str) -> impl Iterator<Item = &'a Obj> + 'a {
    b.iter().filter(move |o| o.kind() == kind)
}

fn find<'a>(b: &'a [Obj], kind: &str, name: &str) -> Option<&'a Obj> {
    b.iter().find(|o| o.kind() == kind && o.name() == name)
}

fn text<'a>(v: &'a Value, pointer: &str, what: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{what}: no string at {pointer}"))
}

fn list<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn strings(v: &Value, pointer: &str) -> Vec<String> {
    list(v, pointer)
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// Whether Secret `name` of the bundle has `key` (in `stringData` or `data`).
fn secret_has(b: &[Obj], name: &str, key: &str) -> bool {
    find(b, "Secret", name)
        .is_some_and(|s| s.v["stringData"].get(key).is_some() || s.v["data"].get(key).is_some())
}

// ---- pods ----------------------------------------------------------------------------

/// The pod spec of a workload (Deployment, DaemonSet) or of a Pod.
struct PodSpec<'a> {
    obj: &'a Obj,
    spec: &'a Value,
}

fn pod_specs(b: &[Obj]) -> Vec<PodSpec<'_>> {
    b.iter()
        .filter_map(|o| match o.kind() {
            "Deployment" | "DaemonSet" => Some(PodSpec {
                obj: o,
                spec: &o.v["spec"]["template"]["spec"],
            }),
            "Pod" => Some(PodSpec {
                obj: o,
                spec: &o.v["spec"],
            }),
            _ => None,
        })
        .collect()
}

fn workload<'a>(b: &'a [Obj], kind: &str, name: &str) -> PodSpec<'a> {
    let obj = find(b, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"));
    PodSpec {
        obj,
        spec: &obj.v["spec"]["template"]["spec"],
    }
}

impl PodSpec<'_> {
    /// Init containers, then containers.
    fn containers(&self) -> Vec<&Value> {
        list(self.spec, "/initContainers")
            .iter()
            .chain(list(self.spec, "/containers"))
            .collect()
    }

    fn container(&self, name: &str) -> &Value {
        self.containers()
            .into_iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{}: no container {name}", self.obj.id()))
    }

    fn volume(&self, name: &str) -> &Value {
        list(self.spec, "/volumes")
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{}: no volume {name}", self.obj.id()))
    }
}

fn cname(c: &Value) -> &str {
    c["name"].as_str().unwrap_or("?")
}

/// The value of `$(VAR)` references when a command line is parsed: an address for `*_IP`.
fn placeholder(var: &str) -> String {
    if var.ends_with("_IP") {
        PLACEHOLDER_IP.to_string()
    } else {
        format!("placeholder-{}", var.to_lowercase())
    }
}

/// `word` with each `$(VAR)` replaced by its placeholder; VAR must be in the container's env.
fn expand(c: &Value, word: &str) -> String {
    let defined: BTreeSet<&str> = list(c, "/env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find("$(") {
        out.push_str(&rest[..at]);
        let end = rest[at..]
            .find(')')
            .unwrap_or_else(|| panic!("{}: unclosed $( in {word:?}", cname(c)));
        let var = &rest[at + 2..at + end];
        assert!(
            defined.contains(var),
            "container {}: {word:?} refers to $({var}), which its env does not define",
            cname(c)
        );
        out.push_str(&placeholder(var));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The container's command line (`command` + `args`; the image's ENTRYPOINT, `glidefs`,
/// when there is no `command`), references expanded.
fn argv(c: &Value) -> Vec<String> {
    let mut words = strings(c, "/command");
    if words.is_empty() {
        words.push("glidefs".into());
    }
    words.extend(strings(c, "/args"));
    words.iter().map(|w| expand(c, w)).collect()
}

/// The value of a `--flag=value` argument of a sidecar.
fn flag(c: &Value, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    strings(c, "/args")
        .into_iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

fn env_field(c: &Value, var: &str) -> String {
    list(c, "/env")
        .iter()
        .find(|e| e["name"] == var)
        .and_then(|e| e.pointer("/valueFrom/fieldRef/fieldPath"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("container {}: no fieldRef env {var}", cname(c)))
        .to_string()
}

/// Where a path inside a container comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    ConfigMap { name: String, key: String },
    Secret { name: String, key: String },
    HostPath(PathBuf),
    EmptyDir { volume: String, rel: PathBuf },
}

/// The key a ConfigMap or Secret volume projects at `rel`.
fn projected_key(volume: &Value, rel: &Path, what: &str) -> String {
    let items = list(volume, "/items");
    if items.is_empty() {
        return rel.to_str().expect("UTF-8").to_string();
    }
    items
        .iter()
        .find(|i| i["path"].as_str().map(Path::new) == Some(rel))
        .and_then(|i| i["key"].as_str())
        .unwrap_or_else(|| panic!("{what}: the volume projects nothing at {}", rel.display()))
        .to_string()
}

/// Where `path` of container `c` in `pod` comes from: the volume mount that holds it.
fn source(pod: &PodSpec<'_>, c: &Value, path: &Path) -> Source {
    let what = format!(
        "{} container {} path {}",
        pod.obj.id(),
        cname(c),
        path.display()
    );
    let mount = list(c, "/volumeMounts")
        .iter()
        .filter(|m| m["mountPath"].as_str().is_some_and(|p| path.starts_with(p)))
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))
        .unwrap_or_else(|| panic!("{what}: on no volume mount"));
    let mut rel = path
        .strip_prefix(text(mount, "/mountPath", &what))
        .expect("under the mount")
        .to_path_buf();
    if let Some(sub) = mount["subPath"].as_str() {
        rel = Path::new(sub).join(rel);
    }
    let volume = pod.volume(text(mount, "/name", &what));
    if let Some(cm) = volume.get("configMap") {
        Source::ConfigMap {
            name: text(cm, "/name", &what).into(),
            key: projected_key(cm, &rel, &what),
        }
    } else if let Some(s) = volume.get("secret") {
        Source::Secret {
            name: text(s, "/secretName", &what).into(),
            key: projected_key(s, &rel, &what),
        }
    } else if let Some(h) = volume.get("hostPath") {
        let host: PathBuf = Path::new(text(h, "/path", &what)).components().collect();
        Source::HostPath(host.join(rel))
    } else if volume.get("emptyDir").is_some() {
        Source::EmptyDir {
            volume: text(volume, "/name", &what).into(),
            rel,
        }
    } else {
        panic!("{what}: volume {volume} is of a kind this test does not know")
    }
}

/// The daemon configuration a `--config` path of `c` names: a key of ConfigMap
/// glidefs-config, parsed by the daemon's own parser.
fn config_at(b: &[Obj], pod: &PodSpec<'_>, c: &Value, path: Option<&Path>) -> Config {
    let path = path.unwrap_or_else(|| panic!("container {}: no --config", cname(c)));
    let Source::ConfigMap { name, key } = source(pod, c, path) else {
        panic!(
            "container {}: --config {} is not from a ConfigMap",
            cname(c),
            path.display()
        )
    };
    assert_eq!(name, "glidefs-config", "container {}", cname(c));
    let cm = find(b, "ConfigMap", &name).expect("ConfigMap glidefs-config");
    let toml = text(&cm.v, &format!("/data/{key}"), &cm.id());
    Config::parse(toml, &format!("{}: {key}", cm.id()))
        .unwrap_or_else(|e| panic!("container {}: {e}", cname(c)))
}

/// A file a glidefs container reads from a Secret: the key must be in the Secret.
fn secret_file(b: &[Obj], pod: &PodSpec<'_>, c: &Value, path: &Path) -> Source {
    let src = source(pod, c, path);
    let Source::Secret { name, key } = &src else {
        panic!(
            "container {}: {} is not from a Secret: {src:?}",
            cname(c),
            path.display()
        )
    };
    assert!(
        secret_has(b, name, key),
        "container {}: {}: Secret {name} of the bundle has no key {key}",
        cname(c),
        path.display()
    );
    src
}

/// A `glidefs` daemon container as the command line and its config say.
struct DaemonSeen {
    pod: String,
    cfg: Config,
    socket: Source,
    token: Option<Source>,
    tls_cert: Option<Source>,
    no_devices: bool,
}

fn check_serve(b: &[Obj], pod: &PodSpec<'_>, c: &Value, args: &ServeArgs) -> DaemonSeen {
    let cfg = config_at(b, pod, c, args.config.as_deref());
    let who = format!("{} container {}", pod.obj.id(), cname(c));
    assert!(
        matches!(
            source(pod, c, &cfg.data_dir),
            Source::HostPath(_) | Source::EmptyDir { .. }
        ),
        "{who}: data_dir {} must be a writable volume",
        cfg.data_dir.display()
    );
    assert!(
        cfg.store
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("s3://")),
        "{who}: store.url must name the S3 bucket every pod shares"
    );
    let socket = source(pod, c, &cfg.api.socket);
    let token = cfg
        .api
        .token_file
        .as_deref()
        .map(|p| secret_file(b, pod, c, p));
    let tls_cert = cfg
        .api
        .tls_cert
        .as_deref()
        .map(|p| secret_file(b, pod, c, p));
    if let Some(key) = cfg.api.tls_key.as_deref() {
        secret_file(b, pod, c, key);
    }
    let privileged = c.pointer("/securityContext/privileged") == Some(&Value::Bool(true));
    assert_eq!(
        privileged, !args.no_devices,
        "{who}: a daemon with devices (and only one) runs privileged"
    );
    DaemonSeen {
        pod: pod.obj.id(),
        cfg,
        socket,
        token,
        tls_cert,
        no_devices: args.no_devices,
    }
}

/// A `glidefs csi` container.
struct CsiSeen {
    pod: String,
    mode: CsiMode,
    cfg: Config,
    socket: Source,
    endpoint: Source,
    node_token: Option<Source>,
    node_ca: Option<Source>,
    advertise: Option<String>,
}

fn check_csi(b: &[Obj], pod: &PodSpec<'_>, c: &Value, args: &CsiArgs) -> CsiSeen {
    let cfg = config_at(b, pod, c, args.config.as_deref());
    let socket_path = args
        .socket
        .clone()
        .unwrap_or_else(|| cfg.api.socket.clone());
    let node_token = args
        .node_token_file
        .as_deref()
        .map(|p| secret_file(b, pod, c, p));
    let node_ca = args.node_ca.as_deref().map(|p| secret_file(b, pod, c, p));
    if args.mode == CsiMode::Node {
        assert!(
            args.node_id.is_some(),
            "{}: node mode needs --node-id",
            pod.obj.id()
        );
        assert_eq!(env_field(c, "NODE_NAME"), "spec.nodeName");
        assert!(
            matches!(source(pod, c, &args.state_dir), Source::HostPath(_)),
            "{}: the node plugin's --state-dir must outlive the pod (a hostPath)",
            pod.obj.id()
        );
    }
    CsiSeen {
        pod: pod.obj.id(),
        mode: args.mode,
        cfg,
        socket: source(pod, c, &socket_path),
        endpoint: source(pod, c, glidefs::csi::socket_path(&args.endpoint)),
        node_token,
        node_ca,
        advertise: args.advertise_api.clone(),
    }
}

/// The `glidefs` command lines of the workloads (containers and exec probes), parsed by the
/// CLI's own clap definitions.
fn glidefs_containers(b: &[Obj]) -> (Vec<DaemonSeen>, Vec<CsiSeen>) {
    let mut daemons = Vec::new();
    let mut csis = Vec::new();
    for pod in pod_specs(b).iter().filter(|p| !p.obj.example()) {
        let mut probes: Vec<(String, PathBuf)> = Vec::new();
        for c in pod.containers() {
            if !c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with(GLIDEFS_IMAGE))
            {
                continue;
            }
            let who = format!("{} container {}", pod.obj.id(), cname(c));
            let words = argv(c);
            if words[0] != "glidefs" {
                // The init container's modprobe (kmod in deploy/Dockerfile).
                assert_eq!(words, ["modprobe", "ublk_drv"], "{who}");
                continue;
            }
            let cli = Cli::try_parse_from(&words)
                .unwrap_or_else(|e| panic!("{who}: `{}`: {e}", words.join(" ")));
            match &cli.command {
                CliCommand::Serve(args) => daemons.push(check_serve(b, pod, c, args)),
                CliCommand::Csi(args) => csis.push(check_csi(b, pod, c, args)),
                _ => panic!("{who}: runs neither `serve` nor `csi`: {words:?}"),
            }
            for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                let command = strings(c, &format!("/{probe}/exec/command"));
                if command.is_empty() {
                    continue;
                }
                let cli = Cli::try_parse_from(&command)
                    .unwrap_or_else(|e| panic!("{who}: {probe} `{}`: {e}", command.join(" ")));
                let CliCommand::Volume(v) = &cli.command else {
                    panic!("{who}: {probe} is not a `glidefs volume` command")
                };
                assert!(matches!(v.command, VolumeCommand::List), "{who}: {probe}");
                let socket = v.target.socket.clone().unwrap_or_else(|| {
                    panic!("{who}: {probe}: --socket (there is no config file in the probe)")
                });
                probes.push((who.clone(), socket));
            }
        }
        // Each probe asks this pod's daemon, at the socket its config names.
        for (who, socket) in probes {
            let daemon = daemons
                .iter()
                .find(|d| d.pod == pod.obj.id())
                .unwrap_or_else(|| panic!("{who}: a daemon probe in a pod without a daemon"));
            assert_eq!(socket, daemon.cfg.api.socket, "{who}: the probe's socket");
        }
    }
    (daemons, csis)
}

// ---- tests ---------------------------------------------------------------------------

#[test]
fn the_validator_accepts_every_manifest() {
    let script = root().join("scripts/validate-manifests");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() == Some(3) {
        panic!(
            "kubernetes-validate is not installed: run `scripts/install-deps --for test` \
             (it installs it into the repository's Python venv)\n{shown}"
        );
    }
    assert!(
        out.status.success(),
        "scripts/validate-manifests failed ({}):\n{shown}",
        out.status
    );
    eprintln!("{shown}");
}

#[test]
fn every_object_is_named_and_in_the_glidefs_namespace() {
    let b = bundle();
    let cluster_scoped = [
        "Namespace",
        "CSIDriver",
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "VolumeSnapshotClass",
    ];
    let known = [
        "ConfigMap",
        "Secret",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "DaemonSet",
        "Pod",
        "PersistentVolumeClaim",
        "VolumeSnapshot",
    ];
    let mut seen = BTreeSet::new();
    for o in &b {
        assert!(
            o.v["apiVersion"].as_str().is_some_and(|a| !a.is_empty()),
            "{}: no apiVersion",
            o.id()
        );
        assert!(!o.name().is_empty(), "{}: no metadata.name", o.id());
        let kind = o.kind();
        assert!(
            cluster_scoped.contains(&kind) || known.contains(&kind),
            "{}: a kind this test does not check: add its checks",
            o.id()
        );
        if cluster_scoped.contains(&kind) || o.example() {
            // Examples go to the namespace they are applied in.
            assert_eq!(o.namespace(), None, "{}", o.id());
        } else {
            assert_eq!(o.namespace(), Some(NAMESPACE), "{}", o.id());
        }
        assert!(
            seen.insert((
                kind.to_string(),
                o.namespace().map(str::to_string),
                o.name()
            )),
            "{}: defined twice",
            o.id()
        );
    }
    let ns = find(&b, "Namespace", NAMESPACE).expect("the Namespace object");
    // `kubectl apply -f deploy/kubernetes/` applies files in name order: the namespace first.
    let first = b.iter().map(|o| o.file.as_str()).min().expect("files");
    assert_eq!(
        ns.file, first,
        "the Namespace must be in the first file applied"
    );
}

#[test]
fn the_driver_objects_name_the_drivers_own_name() {
    let b = bundle();
    let drivers: Vec<&Obj> = of_kind(&b, "CSIDriver").collect();
    assert_eq!(drivers.len(), 1);
    let d = &drivers[0].v;
    assert_eq!(d["metadata"]["name"], DRIVER_NAME);
    // ControllerPublish records the one node a volume is on: the attacher must call it.
    assert_eq!(d["spec"]["attachRequired"], true);
    assert_eq!(d["spec"]["podInfoOnMount"], false);
    assert_eq!(strings(d, "/spec/volumeLifecycleModes"), ["Persistent"]);
    assert_eq!(d["spec"]["fsGroupPolicy"], "File");
    let classes: Vec<&Obj> = of_kind(&b, "StorageClass").collect();
    assert!(classes.len() >= 2);
    for sc in classes {
        assert_eq!(sc.v["provisioner"], DRIVER_NAME, "{}", sc.id());
    }
    let snap_classes: Vec<&Obj> = of_kind(&b, "VolumeSnapshotClass").collect();
    assert_eq!(snap_classes.len(), 1);
    for vsc in snap_classes {
        assert_eq!(vsc.v["driver"], DRIVER_NAME, "{}", vsc.id());
    }
}

#[test]
fn storage_class_parameters_are_accepted_by_the_driver() {
    use glidefs_csi::daemon::{Daemon, VolumeRequest};
    let b = bundle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (mut block, mut filesystem) = (0, 0);
    for sc in of_kind(&b, "StorageClass") {
        let given: std::collections::HashMap<String, String> = sc.v["parameters"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let v = v.as_str().unwrap_or_else(|| {
                            panic!("{}: parameter {k} is not a string", sc.id())
                        });
                        (k.clone(), v.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let params = Params::parse(&given)
            .unwrap_or_else(|e| panic!("{}: the driver refuses its parameters: {e}", sc.id()));
        match given.get("csi.storage.k8s.io/fstype") {
            Some(fs) => {
                assert!(
                    glidefs_csi::caps::FILESYSTEMS.contains(&fs.as_str()),
                    "{}: fstype {fs} is not one NodeStage makes",
                    sc.id()
                );
                filesystem += 1;
            }
            None => block += 1,
        }
        // The daemon client may refuse a request before it connects (as it did `durability:
        // store` before the daemon served it): asked to open a volume of this class at a
        // socket that is not there, it must fail for the missing daemon, nothing else.
        let daemon = glidefs::csi::ApiDaemon::new(glidefs::client::Endpoint::Unix(PathBuf::from(
            "/nonexistent/glidefs-deploy-manifests-test.sock",
        )));
        let req = VolumeRequest {
            name: "pvc-check".into(),
            size: Some(1 << 30),
            block_size: Some(params.block_size),
            durability: params.durability.clone(),
            encryption_key_file: params.encryption_key_file.clone(),
            ..VolumeRequest::default()
        };
        let err = rt
            .block_on(daemon.open(&req))
            .expect_err("no daemon at that socket");
        assert_eq!(
            err.code,
            "unavailable",
            "{}: the driver would refuse every volume of this class: {}",
            sc.id(),
            err.message
        );
        assert!(
            matches!(sc.v["reclaimPolicy"].as_str(), Some("Delete" | "Retain")),
            "{}",
            sc.id()
        );
        assert!(
            matches!(
                sc.v["volumeBindingMode"].as_str(),
                Some("Immediate" | "WaitForFirstConsumer")
            ),
            "{}",
            sc.id()
        );
        assert_eq!(
            sc.v["allowVolumeExpansion"],
            true,
            "{}: the controller and node expand volumes",
            sc.id()
        );
        eprintln!("{}: parameters {given:?} accepted", sc.id());
    }
    assert!(
        block >= 1 && filesystem >= 1,
        "a block and a filesystem StorageClass"
    );
}

#[test]
fn snapshot_custom_resources_are_well_formed() {
    // kubernetes-validate has no schema for these (custom resources of
    // kubernetes-csi/external-snapshotter): their fields are checked here instead.
    let b = bundle();
    let mut checked = 0;
    for o in of_kind(&b, "VolumeSnapshotClass") {
        assert_eq!(
            o.v["apiVersion"],
            "snapshot.storage.k8s.io/v1",
            "{}",
            o.id()
        );
        let keys: BTreeSet<&str> =
            o.v.as_object()
                .expect("a map")
                .keys()
                .map(String::as_str)
                .collect();
        let allowed = BTreeSet::from([
            "apiVersion",
            "kind",
            "metadata",
            "driver",
            "deletionPolicy",
            "parameters",
        ]);
        assert!(
            keys.is_subset(&allowed),
            "{}: unknown fields in {keys:?}",
            o.id()
        );
        assert_eq!(o.v["driver"], DRIVER_NAME, "{}", o.id());
        assert!(
            matches!(o.v["deletionPolicy"].as_str(), Some("Delete" | "Retain")),
            "{}: deletionPolicy is required: Delete or Retain",
            o.id()
        );
        eprintln!(
            "checked {}: apiVersion snapshot.storage.k8s.io/v1, known fields only, driver {DRIVER_NAME}, \
             deletionPolicy Delete|Retain",
            o.id()
        );
        checked += 1;
    }
    for o in of_kind(&b, "VolumeSnapshot") {
        assert_eq!(
            o.v["apiVersion"],
            "snapshot.storage.k8s.io/v1",
            "{}",
            o.id()
        );
        let spec = o.v["spec"]
            .as_object()
            .unwrap_or_else(|| panic!("{}: no spec", o.id()));
        for k in spec.keys() {
            assert!(
                ["volumeSnapshotClassName", "source"].contains(&k.as_str()),
                "{}: unknown spec field {k}",
                o.id()
            );
        }
        let class = text(&o.v, "/spec/volumeSnapshotClassName", &o.id());
        assert!(
            find(&b, "VolumeSnapshotClass", class).is_some(),
            "{}: no VolumeSnapshotClass {class}",
            o.id()
        );
        let source = o.v["spec"]["source"]
            .as_object()
            .unwrap_or_else(|| panic!("{}: spec.source is required", o.id()));
        assert_eq!(source.len(), 1, "{}: exactly one source", o.id());
        let pvc = source
            .get("persistentVolumeClaimName")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{}: the source is a PVC of the examples", o.id()));
        let claim = find(&b, "PersistentVolumeClaim", pvc)
            .unwrap_or_else(|| panic!("{}: no PVC {pvc}", o.id()));
        let sc = text(&claim.v, "/spec/storageClassName", &claim.id());
        assert_eq!(
            find(&b, "StorageClass", sc).map(|s| &s.v["provisioner"]),
            Some(&Value::from(DRIVER_NAME)),
            "{}: the source PVC is a glidefs volume",
            o.id()
        );
        eprintln!(
            "checked {}: apiVersion snapshot.storage.k8s.io/v1, known spec fields only, class {class} \
             in the bundle, one source: PVC {pvc} of class {sc} (driver {DRIVER_NAME})",
            o.id()
        );
        checked += 1;
    }
    assert!(checked >= 2, "a VolumeSnapshotClass and a VolumeSnapshot");
}

#[test]
fn the_daemon_configs_parse() {
    let b = bundle();
    let cm = find(&b, "ConfigMap", "glidefs-config").expect("ConfigMap glidefs-config");
    let data = cm.v["data"].as_object().expect("data");
    assert!(!data.is_empty());
    for (key, toml) in data {
        assert!(key.ends_with(".toml"), "{}: {key}", cm.id());
        let toml = toml.as_str().expect("a string");
        let cfg = Config::parse(toml, key).unwrap_or_else(|e| panic!("{}: {e}", cm.id()));
        eprintln!(
            "{}: {key} parses: store {:?}, socket {}, tcp {:?}",
            cm.id(),
            cfg.store.url,
            cfg.api.socket.display(),
            cfg.api.tcp
        );
    }
}

#[test]
fn glidefs_command_lines_parse_and_name_what_is_mounted() {
    let b = bundle();
    let (daemons, csis) = glidefs_containers(&b);
    assert_eq!(
        daemons.len(),
        2,
        "a daemon in the controller pod and in the node pod"
    );
    assert_eq!(
        csis.len(),
        2,
        "`glidefs csi` in the controller pod and in the node pod"
    );
    let controller = csis
        .iter()
        .find(|c| c.mode == CsiMode::Controller)
        .expect("a controller");
    let node = csis
        .iter()
        .find(|c| c.mode == CsiMode::Node)
        .expect("a node plugin");
    let daemon_of = |csi: &CsiSeen| {
        let mut ds = daemons.iter().filter(|d| d.pod == csi.pod);
        let d = ds
            .next()
            .unwrap_or_else(|| panic!("{}: no daemon in the pod", csi.pod));
        assert!(ds.next().is_none(), "{}: one daemon per pod", csi.pod);
        d
    };
    for csi in &csis {
        let d = daemon_of(csi);
        // The driver talks to the daemon of its pod, through the socket file they share.
        assert_eq!(csi.socket, d.socket, "{}: the daemon's API socket", csi.pod);
        assert_eq!(csi.cfg.api.socket, d.cfg.api.socket, "{}", csi.pod);
        // ... and keeps its records in the same store.
        assert_eq!(csi.cfg.store.url, d.cfg.store.url, "{}", csi.pod);
    }
    let (cd, nd) = (daemon_of(controller), daemon_of(node));
    assert!(cd.no_devices, "the controller's daemon serves no devices");
    assert!(!nd.no_devices, "the node's daemon serves ublk devices");
    assert_eq!(cd.cfg.store.url, nd.cfg.store.url, "one store for all");
    assert!(
        cd.cfg.api.tcp.is_none(),
        "the controller's daemon needs no TCP API"
    );

    // The node plugin advertises its daemon's TCP API at the node's address; the controller
    // reaches it with the token and CA of the Secrets the node daemon serves with.
    let tcp = nd.cfg.api.tcp.expect("the node daemon's api.tcp");
    assert!(nd.cfg.api.tls(), "a TCP API off loopback is TLS");
    let node_pod = workload(&b, "DaemonSet", "glidefs-csi-node");
    assert_eq!(
        node_pod.spec["hostNetwork"], true,
        "api.tcp {tcp} listens in the host's network, where the node's IP is"
    );
    assert!(
        tcp.ip().is_unspecified(),
        "api.tcp {tcp}: every address of the node"
    );
    assert_eq!(
        node.advertise.as_deref(),
        Some(format!("https://{PLACEHOLDER_IP}:{}", tcp.port()).as_str()),
        "--advertise-api: https://$(NODE_IP):<port of api.tcp>"
    );
    assert_eq!(
        env_field(node_pod.container("glidefs-csi"), "NODE_IP"),
        "status.hostIP"
    );
    assert_eq!(
        controller.node_token, nd.token,
        "the controller presents the token the node daemons check"
    );
    let Some(Source::Secret {
        name: tls_secret, ..
    }) = &nd.tls_cert
    else {
        panic!("the node daemon's TLS certificate comes from a Secret")
    };
    let Some(Source::Secret {
        name: ca_secret,
        key: ca_key,
    }) = &controller.node_ca
    else {
        panic!("the controller verifies node daemons with --node-ca")
    };
    assert_eq!(
        ca_secret, tls_secret,
        "the CA of the node daemons' certificate"
    );
    assert_eq!(ca_key, "ca.crt");
    assert!(controller.advertise.is_none());
}

#[test]
fn sockets_connect_the_sidecars_and_the_kubelet() {
    let b = bundle();
    let (_, csis) = glidefs_containers(&b);

    // Controller: every sidecar on the driver's socket; the four controllers leader-elected.
    let pod = workload(&b, "Deployment", "glidefs-csi-controller");
    let controller = csis
        .iter()
        .find(|c| c.mode == CsiMode::Controller)
        .expect("controller");
    assert!(matches!(controller.endpoint, Source::EmptyDir { .. }));
    let mut sidecars = BTreeSet::new();
    for c in pod.containers() {
        let Some(address) = flag(c, "--csi-address") else {
            continue;
        };
        assert_eq!(
            source(&pod, c, Path::new(&address)),
            controller.endpoint,
            "{}: --csi-address",
            cname(c)
        );
        sidecars.insert(cname(c).to_string());
        if cname(c) != "livenessprobe" {
            assert!(
                strings(c, "/args").contains(&"--leader-election".to_string()),
                "{}: --leader-election",
                cname(c)
            );
        }
    }
    let want = [
        "csi-attacher",
        "csi-provisioner",
        "csi-resizer",
        "csi-snapshotter",
        "livenessprobe",
    ];
    assert_eq!(sidecars, want.iter().map(|s| s.to_string()).collect());
    assert_eq!(pod.obj.v["spec"]["replicas"], 1);

    // Node: the kubelet finds the plugin at the registration path, which is the plugin's
    // socket as the host sees it.
    let pod = workload(&b, "DaemonSet", "glidefs-csi-node");
    let node = csis.iter().find(|c| c.mode == CsiMode::Node).expect("node");
    let Source::HostPath(socket) = &node.endpoint else {
        panic!(
            "the node plugin's socket is on a hostPath: {:?}",
            node.endpoint
        )
    };
    assert_eq!(
        socket,
        &Path::new("/var/lib/kubelet/plugins")
            .join(DRIVER_NAME)
            .join("csi.sock")
    );
    let registrar = pod.container("node-driver-registrar");
    let registration = flag(registrar, "--kubelet-registration-path").expect("the path");
    assert_eq!(
        Path::new(&registration),
        socket,
        "--kubelet-registration-path"
    );
    for c in [registrar, pod.container("livenessprobe")] {
        let address = flag(c, "--csi-address").expect("--csi-address");
        assert_eq!(
            source(&pod, c, Path::new(&address)),
            node.endpoint,
            "{}",
            cname(c)
        );
    }
    assert_eq!(
        source(&pod, registrar, Path::new("/registration/x")),
        Source::HostPath("/var/lib/kubelet/plugins_registry/x".into()),
        "the kubelet's plugin registration directory"
    );
    // Mounts the plugin makes under the kubelet's directory reach the host and the pods.
    let csi = pod.container("glidefs-csi");
    assert_eq!(csi["securityContext"]["privileged"], true);
    let kubelet = list(csi, "/volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet")
        .expect("the kubelet directory");
    assert_eq!(kubelet["mountPropagation"], "Bidirectional");
    assert_eq!(
        source(&pod, csi, Path::new("/var/lib/kubelet/pods")),
        Source::HostPath("/var/lib/kubelet/pods".into())
    );
    for name in ["glidefs-csi", "glidefs-daemon"] {
        assert_eq!(
            source(&pod, pod.container(name), Path::new("/dev/ublkb0")),
            Source::HostPath("/dev/ublkb0".into()),
            "{name}: the host's /dev (ublk devices)"
        );
    }

    // The HTTP health endpoints the probes ask are the ones the sidecars serve.
    for (kind, name) in [
        ("Deployment", "glidefs-csi-controller"),
        ("DaemonSet", "glidefs-csi-node"),
    ] {
        let pod = workload(&b, kind, name);
        for c in pod.containers() {
            let Some(get) = c.pointer("/livenessProbe/httpGet") else {
                continue;
            };
            let port = match &get["port"] {
                Value::Number(n) => n.as_u64().expect("a port"),
                Value::String(named) => list(c, "/ports")
                    .iter()
                    .find(|p| p["name"] == named.as_str())
                    .and_then(|p| p["containerPort"].as_u64())
                    .unwrap_or_else(|| panic!("{name}: no port {named}")),
                other => panic!("{name}: port {other}"),
            };
            let server = if cname(c) == "glidefs-csi" {
                pod.container("livenessprobe")
            } else {
                c
            };
            let endpoint = flag(server, "--http-endpoint")
                .unwrap_or_else(|| panic!("{name} {}: --http-endpoint", cname(server)));
            let (host, served) = endpoint.rsplit_once(':').expect("HOST:PORT");
            assert_eq!(served, port.to_string(), "{name} {}", cname(c));
            if pod.spec["hostNetwork"] == true {
                assert_eq!(
                    host, "127.0.0.1",
                    "{name}: loopback only on the host's network"
                );
                assert_eq!(get["host"], host, "{name} {}", cname(c));
            }
        }
    }
}

#[test]
fn images_are_pinned_and_probes_restart_nothing_that_holds_devices() {
    let b = bundle();
    for pod in pod_specs(&b).iter().filter(|p| !p.obj.example()) {
        for c in pod.containers() {
            let image = text(c, "/image", &pod.obj.id());
            let (repo, tag) = image.rsplit_once(':').expect("a tag");
            if repo == GLIDEFS_IMAGE.trim_end_matches(':') {
                assert_eq!(tag, env!("CARGO_PKG_VERSION"), "{image}");
                continue;
            }
            assert!(
                repo.starts_with("registry.k8s.io/sig-storage/"),
                "{}: {image}",
                pod.obj.id()
            );
            let v: Vec<&str> = tag.trim_start_matches('v').split('.').collect();
            assert!(
                tag.starts_with('v') && v.len() == 3 && v.iter().all(|p| p.parse::<u32>().is_ok()),
                "{image}: a released vX.Y.Z tag"
            );
        }
    }
    // Restarting the node's daemon removes the devices of the volumes in use.
    let pod = workload(&b, "DaemonSet", "glidefs-csi-node");
    let daemon = pod.container("glidefs-daemon");
    assert!(daemon.get("livenessProbe").is_none());
    assert!(daemon.get("startupProbe").is_none());
    assert_eq!(pod.obj.v["spec"]["updateStrategy"]["type"], "OnDelete");
    for (kind, name) in [
        ("DaemonSet", "glidefs-csi-node"),
        ("Deployment", "glidefs-csi-controller"),
    ] {
        let pod = workload(&b, kind, name);
        assert!(
            pod.spec["terminationGracePeriodSeconds"]
                .as_u64()
                .is_some_and(|s| s >= 120),
            "{name}: time for the daemon to flush and close its volumes"
        );
    }
}

#[test]
fn references_between_objects_resolve() {
    let b = bundle();
    for pod in pod_specs(&b) {
        let id = pod.obj.id();
        if let Some(sa) = pod.spec["serviceAccountName"].as_str() {
            let found = find(&b, "ServiceAccount", sa);
            assert!(
                found.is_some_and(|s| s.namespace() == pod.obj.namespace()),
                "{id}: no ServiceAccount {sa}"
            );
        }
        if matches!(pod.obj.kind(), "Deployment" | "DaemonSet") {
            let selector = pod.obj.v["spec"]["selector"]["matchLabels"]
                .as_object()
                .expect("matchLabels");
            let labels = &pod.obj.v["spec"]["template"]["metadata"]["labels"];
            for (k, v) in selector {
                assert_eq!(&labels[k], v, "{id}: the selector must match the template");
            }
        }
        let mut names = BTreeSet::new();
        for c in pod.containers() {
            assert!(names.insert(cname(c)), "{id}: container {} twice", cname(c));
            for e in list(c, "/envFrom") {
                if let Some(s) = e.pointer("/secretRef/name").and_then(Value::as_str) {
                    assert!(find(&b, "Secret", s).is_some(), "{id}: no Secret {s}");
                }
            }
            for m in list(c, "/volumeMounts") {
                let volume = pod.volume(text(m, "/name", &id));
                if let Some(p) = m["mountPropagation"].as_str() {
                    assert!(
                        ["None", "HostToContainer", "Bidirectional"].contains(&p),
                        "{id}: mountPropagation {p}"
                    );
                    if p == "Bidirectional" {
                        assert_eq!(c["securityContext"]["privileged"], true, "{id}");
                    }
                }
                assert!(volume.is_object());
            }
        }
        let mut volumes = BTreeSet::new();
        for v in list(pod.spec, "/volumes") {
            let name = text(v, "/name", &id);
            assert!(volumes.insert(name), "{id}: volume {name} twice");
            if let Some(cm) = v.get("configMap") {
                let n = text(cm, "/name", &id);
                let map =
                    find(&b, "ConfigMap", n).unwrap_or_else(|| panic!("{id}: no ConfigMap {n}"));
                for item in list(cm, "/items") {
                    let key = text(item, "/key", &id);
                    assert!(
                        map.v["data"].get(key).is_some(),
                        "{id}: ConfigMap {n} has no {key}"
                    );
                }
            }
            if let Some(s) = v.get("secret") {
                let n = text(s, "/secretName", &id);
                if s["optional"] == true {
                    continue;
                }
                assert!(find(&b, "Secret", n).is_some(), "{id}: no Secret {n}");
                for item in list(s, "/items") {
                    let key = text(item, "/key", &id);
                    assert!(secret_has(&b, n, key), "{id}: Secret {n} has no {key}");
                }
            }
            if let Some(h) = v.get("hostPath") {
                let t = h["type"].as_str().unwrap_or("");
                assert!(
                    [
                        "",
                        "DirectoryOrCreate",
                        "Directory",
                        "FileOrCreate",
                        "File",
                        "Socket",
                        "CharDevice",
                        "BlockDevice"
                    ]
                    .contains(&t),
                    "{id}: hostPath type {t}"
                );
            }
        }
    }
    for binding in of_kind(&b, "ClusterRoleBinding").chain(of_kind(&b, "RoleBinding")) {
        let role_kind = text(&binding.v, "/roleRef/kind", &binding.id());
        let role = text(&binding.v, "/roleRef/name", &binding.id());
        let found = find(&b, role_kind, role)
            .unwrap_or_else(|| panic!("{}: no {role_kind} {role}", binding.id()));
        assert_eq!(found.namespace(), binding.namespace(), "{}", binding.id());
        for s in list(&binding.v, "/subjects") {
            assert_eq!(s["kind"], "ServiceAccount", "{}", binding.id());
            let sa = find(&b, "ServiceAccount", text(s, "/name", &binding.id()));
            assert!(
                sa.is_some_and(|sa| sa.namespace() == s["namespace"].as_str()),
                "{}: subject {s}",
                binding.id()
            );
        }
    }
}

/// Whether service account `sa` of [`NAMESPACE`] may `verb` `resource` of `group` (in the
/// namespace: its Roles count too).
fn allowed(b: &[Obj], sa: &str, group: &str, resource: &str, verb: &str) -> bool {
    let rule_allows = |r: &Value| {
        let has = |field: &str, want: &str| {
            strings(r, &format!("/{field}"))
                .iter()
                .any(|x| x == want || x == "*")
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    };
    of_kind(b, "ClusterRoleBinding")
        .chain(of_kind(b, "RoleBinding"))
        .filter(|binding| {
            list(&binding.v, "/subjects")
                .iter()
                .any(|s| s["name"] == sa && s["namespace"] == NAMESPACE)
        })
        .filter_map(|binding| {
            find(
                b,
                binding.v["roleRef"]["kind"].as_str()?,
                binding.v["roleRef"]["name"].as_str()?,
            )
        })
        .any(|role| list(&role.v, "/rules").iter().any(rule_allows))
}

#[test]
fn the_controller_account_may_do_what_its_sidecars_do() {
    let b = bundle();
    let sa = workload(&b, "Deployment", "glidefs-csi-controller").spec["serviceAccountName"]
        .as_str()
        .expect("the controller's service account")
        .to_string();
    let needs = [
        // external-provisioner
        ("", "persistentvolumes", "create"),
        ("", "persistentvolumes", "delete"),
        ("", "persistentvolumeclaims", "update"),
        ("storage.k8s.io", "storageclasses", "watch"),
        ("snapshot.storage.k8s.io", "volumesnapshots", "get"),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
        ("storage.k8s.io", "volumeattachments", "watch"),
        ("", "events", "create"),
        // external-attacher
        ("storage.k8s.io", "volumeattachments", "patch"),
        ("storage.k8s.io", "volumeattachments/status", "patch"),
        ("storage.k8s.io", "csinodes", "get"),
        ("", "persistentvolumes", "patch"),
        // csi-snapshotter
        ("snapshot.storage.k8s.io", "volumesnapshotclasses", "watch"),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            "update",
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents/status",
            "patch",
        ),
        // external-resizer
        ("", "persistentvolumeclaims/status", "patch"),
        ("", "pods", "list"),
        // leader election of the four
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ];
    for (group, resource, verb) in needs {
        assert!(
            allowed(&b, &sa, group, resource, verb),
            "{sa} may not {verb} {resource} of API group {group:?}"
        );
    }
    // Leases only in the namespace: a Role, not a ClusterRole.
    let lease_roles: Vec<&Obj> = of_kind(&b, "ClusterRole")
        .filter(|r| {
            list(&r.v, "/rules")
                .iter()
                .any(|rule| strings(rule, "/resources").contains(&"leases".to_string()))
        })
        .collect();
    assert!(lease_roles.is_empty(), "leases through a ClusterRole");
    // The node pod calls no API.
    let node = workload(&b, "DaemonSet", "glidefs-csi-node");
    assert_eq!(node.spec["automountServiceAccountToken"], false);
    let node_sa = node.spec["serviceAccountName"]
        .as_str()
        .expect("an account");
    for (group, resource, verb) in needs {
        assert!(
            !allowed(&b, node_sa, group, resource, verb),
            "{node_sa}: {verb} {resource}"
        );
    }
}

#[test]
fn examples_use_the_bundles_classes_and_sources() {
    let b = bundle();
    let examples: Vec<&Obj> = b.iter().filter(|o| o.example()).collect();
    let claim = |name: &str| {
        examples
            .iter()
            .find(|o| o.kind() == "PersistentVolumeClaim" && o.name() == name)
            .unwrap_or_else(|| panic!("no example PVC {name}"))
    };
    let (mut restored, mut cloned) = (0, 0);
    for pvc in examples
        .iter()
        .filter(|o| o.kind() == "PersistentVolumeClaim")
    {
        let sc = text(&pvc.v, "/spec/storageClassName", &pvc.id());
        let class = find(&b, "StorageClass", sc).unwrap_or_else(|| panic!("{}: no {sc}", pvc.id()));
        let block = pvc.v["spec"]["volumeMode"] == "Block";
        assert_eq!(
            class.v["parameters"]
                .get("csi.storage.k8s.io/fstype")
                .is_none(),
            block,
            "{}: block volumes from the block class, filesystems from a filesystem class",
            pvc.id()
        );
        let Some(ds) = pvc.v["spec"].get("dataSource") else {
            continue;
        };
        match text(ds, "/kind", &pvc.id()) {
            "VolumeSnapshot" => {
                assert_eq!(ds["apiGroup"], "snapshot.storage.k8s.io", "{}", pvc.id());
                let snap = find(&b, "VolumeSnapshot", text(ds, "/name", &pvc.id()))
                    .unwrap_or_else(|| panic!("{}: no such snapshot", pvc.id()));
                let src = claim(text(
                    &snap.v,
                    "/spec/source/persistentVolumeClaimName",
                    &snap.id(),
                ));
                assert_eq!(src.v["spec"]["storageClassName"], sc, "{}", pvc.id());
                restored += 1;
            }
            "PersistentVolumeClaim" => {
                assert!(ds.get("apiGroup").is_none_or(|g| g == ""), "{}", pvc.id());
                let src = claim(text(ds, "/name", &pvc.id()));
                // A clone is of the source's class and at least its size.
                assert_eq!(src.v["spec"]["storageClassName"], sc, "{}", pvc.id());
                assert_eq!(
                    src.v["spec"]["resources"]["requests"]["storage"],
                    pvc.v["spec"]["resources"]["requests"]["storage"],
                    "{}",
                    pvc.id()
                );
                cloned += 1;
            }
            other => panic!("{}: data source kind {other}", pvc.id()),
        }
    }
    assert!(restored >= 1 && cloned >= 1, "a restore and a clone");
    let (mut block_pods, mut fs_pods) = (0, 0);
    for pod in pod_specs(&b).iter().filter(|p| p.obj.example()) {
        for v in list(pod.spec, "/volumes") {
            let Some(name) = v
                .pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
            else {
                continue;
            };
            let block = claim(name).v["spec"]["volumeMode"] == "Block";
            let vname = text(v, "/name", &pod.obj.id());
            let uses = |field: &str| {
                list(pod.spec, "/containers").iter().any(|c| {
                    list(c, &format!("/{field}"))
                        .iter()
                        .any(|m| m["name"] == vname)
                })
            };
            if block {
                assert!(
                    uses("volumeDevices") && !uses("volumeMounts"),
                    "{}",
                    pod.obj.id()
                );
                block_pods += 1;
            } else {
                assert!(
                    uses("volumeMounts") && !uses("volumeDevices"),
                    "{}",
                    pod.obj.id()
                );
                fs_pods += 1;
            }
        }
    }
    assert!(
        block_pods >= 1 && fs_pods >= 1,
        "a block pod and a filesystem pod"
    );
}

#[test]
fn the_dockerfile_builds_the_binary_and_ships_the_mounters_tools() {
    let text =
        std::fs::read_to_string(root().join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let from: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        from,
        [
            "FROM rust:1.95-bookworm AS build",
            "FROM debian:bookworm-slim"
        ]
    );
    let toolchain = std::fs::read_to_string(root().join("rust-toolchain.toml")).expect("toolchain");
    assert!(
        toolchain.contains("channel = \"1.95"),
        "the build image's Rust is rust-toolchain.toml's"
    );
    let body = lines.join("\n");
    assert!(body.contains("cargo build --release --locked -p glidefs"));
    // The tools crates/csi/src/mounter.rs and the node pod's init container run.
    for package in [
        "e2fsprogs",
        "xfsprogs",
        "util-linux",
        "mount",
        "kmod",
        "ca-certificates",
    ] {
        assert!(
            body.split_whitespace().any(|w| w == package),
            "the runtime image installs {package}"
        );
    }
    assert!(body.contains("COPY --from=build /usr/local/bin/glidefs /usr/local/bin/glidefs"));
    assert_eq!(
        lines.last().copied(),
        Some("ENTRYPOINT [\"/usr/local/bin/glidefs\"]"),
        "containers without a command run `glidefs ARGS`"
    );
}
