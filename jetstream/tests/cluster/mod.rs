//! A real three-node NATS JetStream cluster on loopback, with TLS and password and NKey authorization, for integration
//! tests.
//!
//! [`Cluster::start`] generates a throwaway CA plus server and client certificates with the `openssl` CLI, writes one
//! `nats-server` configuration per node into a temporary directory, starts the three processes and waits until the
//! JetStream meta group has a leader that every node agrees on. Dropping the [`Cluster`] kills every server.
//!
//! Nodes are addressed by index `0..NODES`; node `i` runs with `server_name` `n{i + 1}`.
#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Number of servers in the cluster.
pub const NODES: usize = 3;

/// Name of the NATS cluster (the `cluster { name }` setting).
pub const CLUSTER_NAME: &str = "annal-test";

/// How long [`Cluster::start`], [`Cluster::restart`] and [`Cluster::wait_ready`] wait for the cluster.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

const POLL_INTERVAL: Duration = Duration::from_millis(100);
const LOG_TAIL_LINES: usize = 40;
/// Ports are picked by binding port 0 and released before the servers bind them, so another process can take one in
/// between; such a start is retried with fresh ports.
const START_ATTEMPTS: usize = 3;
const CERT_DAYS: &str = "7";

const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = annal test

[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// Options for [`Cluster::start_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterOptions {
    /// Require clients to present a certificate signed by the test CA (`verify: true`, mutual TLS).
    pub verify_clients: bool,
}

/// A running three-node JetStream cluster; every server is killed when this is dropped.
pub struct Cluster {
    binary: PathBuf,
    options: ClusterOptions,
    tls: TlsFiles,
    user: (String, String),
    /// An NKey user of the `ANNAL` account, registered by its public key.
    nkey_user: nkeys::KeyPair,
    other_user: (String, String),
    route_password: String,
    nodes: Vec<Node>,
    dir: TempDir,
}

struct TlsFiles {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

struct Node {
    name: String,
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    client_port: u16,
    cluster_port: u16,
    http_port: u16,
    child: Mutex<Option<Child>>,
}

enum NotReady {
    Exited { node: usize, status: ExitStatus },
    Timeout { state: String },
}

impl Cluster {
    /// Starts the cluster with default options (TLS without client certificates) and waits until it is ready.
    pub fn start() -> Cluster {
        Cluster::start_with(ClusterOptions::default())
    }

    /// Starts the cluster with `options` and waits until it is ready.
    pub fn start_with(options: ClusterOptions) -> Cluster {
        let binary = find_server();
        let dir = tempfile::Builder::new().prefix("annal-nats-").tempdir().expect("create temporary directory");
        let tls = generate_tls(&dir.path().join("tls"));
        let mut cluster = Cluster {
            binary,
            options,
            tls,
            user: ("annal".to_string(), secret()),
            nkey_user: nkeys::KeyPair::new_user(),
            other_user: ("other".to_string(), secret()),
            route_password: secret(),
            nodes: Vec::new(),
            dir,
        };
        for attempt in 1..=START_ATTEMPTS {
            cluster.configure();
            for i in 0..NODES {
                cluster.spawn(i);
            }
            match cluster.poll_ready() {
                Ok(()) => return cluster,
                Err(NotReady::Exited { node, .. })
                    if attempt < START_ATTEMPTS && cluster.log_tail(node).contains("address already in use") =>
                {
                    cluster.stop_all();
                }
                Err(reason) => cluster.fail(reason),
            }
        }
        unreachable!("the last start attempt either succeeds or panics")
    }

    /// Client URLs (`tls://127.0.0.1:<port>`) of the nodes that are running.
    pub fn urls(&self) -> Vec<String> {
        (0..NODES).filter(|&i| self.is_running(i)).map(|i| self.url(i)).collect()
    }

    /// Client URL (`tls://127.0.0.1:<port>`) of node `i`, whether or not it is running.
    pub fn url(&self, i: usize) -> String {
        format!("tls://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// Client address of node `i`.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[i].client_port))
    }

    /// The `server_name` of node `i` (`n1`, `n2`, ...).
    pub fn server_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// PEM file of the CA that signed the server and client certificates.
    pub fn ca_file(&self) -> PathBuf {
        self.tls.ca.clone()
    }

    /// PEM files `(certificate, private key)` of a client certificate signed by the test CA.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        (self.tls.client_cert.clone(), self.tls.client_key.clone())
    }

    /// Client options for stream `stream` (subject prefix its name in lower case), as
    /// the `ANNAL` account's password user, over TLS with the test CA.
    pub fn client_options(&self, stream: &str) -> annal_jetstream::Options {
        let (user, password) = self.user();
        annal_jetstream::Options {
            servers: self.urls(),
            credentials: annal_jetstream::Credentials::UserPassword { user, password },
            tls: annal_jetstream::Tls { required: true, ca_file: Some(self.ca_file()), client_cert: None },
            stream: stream.into(),
            subject_prefix: stream.to_lowercase(),
            ..annal_jetstream::Options::default()
        }
    }

    /// The URL (`annal_jetstream::Options::from_url`) of stream `stream` on every node,
    /// as the `ANNAL` account's user with `password`.
    pub fn stream_url_with(&self, stream: &str, password: &str) -> String {
        let (user, _) = self.user();
        let hosts: Vec<String> = (0..NODES).map(|i| self.url(i).trim_start_matches("tls://").to_string()).collect();
        format!("tls://{user}:{password}@{}/{stream}?ca={}", hosts.join(","), self.ca_file().display())
    }

    /// [`Cluster::stream_url_with`] the account's own password.
    pub fn stream_url(&self, stream: &str) -> String {
        self.stream_url_with(stream, &self.user().1)
    }

    /// `(user, password)` of the `ANNAL` account.
    pub fn user(&self) -> (String, String) {
        self.user.clone()
    }

    /// The seed (`SU...`) of the `ANNAL` account's NKey user; the servers know only its public key.
    pub fn nkey_seed(&self) -> String {
        self.nkey_user.seed().expect("a generated key pair has a seed")
    }

    /// `(user, password)` of the `OTHER` account, for isolation tests.
    pub fn other_user(&self) -> (String, String) {
        self.other_user.clone()
    }

    /// The temporary directory holding certificates, configurations, logs and JetStream stores.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether node `i` has a server process (started and not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.child(i).is_some()
    }

    /// SIGKILLs node `i` and waits for the process to exit; does nothing if it is not running.
    pub fn kill(&mut self, i: usize) {
        let child = self.nodes[i].child.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(child) = child {
            reap(child);
        }
    }

    /// Starts node `i` again with the same configuration and store directory, then waits until the cluster is ready.
    pub fn restart(&mut self, i: usize) {
        assert!(!self.is_running(i), "restart({i}): node {} is still running", self.nodes[i].name);
        let marker = format!("\n===== restart of {} =====\n", self.nodes[i].name);
        append(&self.nodes[i].log, &marker);
        self.spawn(i);
        self.wait_ready();
    }

    /// Waits until every running node's `/healthz` is ok and all of them name the same running node as JetStream
    /// meta leader; panics with the nodes' logs after [`READY_TIMEOUT`] or if a server exits.
    pub fn wait_ready(&self) {
        if let Err(reason) = self.poll_ready() {
            self.fail(reason);
        }
    }

    /// Index of the meta leader all running nodes agree on, if they agree on a running node right now.
    pub fn meta_leader(&self) -> Option<usize> {
        let mut leaders = (0..NODES).filter(|&i| self.is_running(i)).map(|i| self.reported_leader(i));
        let first = leaders.next()??;
        if !leaders.all(|l| l.as_deref() == Some(first.as_str())) {
            return None;
        }
        (0..NODES).find(|&i| self.nodes[i].name == first && self.is_running(i))
    }

    /// The meta leader's `server_name` as reported by node `i`'s `/jsz` (may be stale right after a leader dies).
    pub fn reported_leader(&self, i: usize) -> Option<String> {
        let (status, body) = self.monitor_get(i, "/jsz").ok()?;
        if status != 200 {
            return None;
        }
        meta_leader_in_jsz(&body)
    }

    /// Sends `GET <path>` to node `i`'s HTTP monitoring port and returns the status code and body.
    pub fn monitor_get(&self, i: usize, path: &str) -> io::Result<(u16, String)> {
        http_get(self.nodes[i].http_port, path)
    }

    /// The last lines of node `i`'s server log (stdout and stderr), for diagnostics.
    pub fn log_tail(&self, i: usize) -> String {
        let node = &self.nodes[i];
        match fs::read(&node.log) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
            }
            Err(e) => format!("(cannot read {}: {e})", node.log.display()),
        }
    }

    fn child(&self, i: usize) -> MutexGuard<'_, Option<Child>> {
        self.nodes[i].child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Picks fresh ports, (re)creates every node's directory and writes its configuration.
    fn configure(&mut self) {
        let ports = free_ports(NODES * 3);
        self.nodes = (0..NODES)
            .map(|i| {
                let name = format!("n{}", i + 1);
                let dir = self.dir.path().join(&name);
                if dir.exists() {
                    fs::remove_dir_all(&dir).expect("remove node directory");
                }
                fs::create_dir_all(&dir).expect("create node directory");
                Node {
                    config: dir.join("nats.conf"),
                    log: dir.join("server.log"),
                    client_port: ports[i * 3],
                    cluster_port: ports[i * 3 + 1],
                    http_port: ports[i * 3 + 2],
                    child: Mutex::new(None),
                    name,
                    dir,
                }
            })
            .collect();
        for i in 0..NODES {
            let config = self.config_text(i);
            fs::write(&self.nodes[i].config, &config).expect("write server configuration");
            let check = Command::new(&self.binary).arg("-t").arg("-c").arg(&self.nodes[i].config).output();
            let check = check.expect("run nats-server -t");
            if !check.status.success() {
                panic!(
                    "nats-server rejected the configuration of {}:\n{}{}\n--- {} ---\n{config}",
                    self.nodes[i].name,
                    String::from_utf8_lossy(&check.stdout),
                    String::from_utf8_lossy(&check.stderr),
                    self.nodes[i].config.display(),
                );
            }
        }
    }

    fn config_text(&self, i: usize) -> String {
        let node = &self.nodes[i];
        let routes: String = self
            .nodes
            .iter()
            .filter(|other| other.name != node.name)
            .map(|other| {
                let url = format!("nats-route://route:{}@127.0.0.1:{}", self.route_password, other.cluster_port);
                format!("    {}\n", quote(&url))
            })
            .collect();
        let verify = if self.options.verify_clients { "  verify: true\n" } else { "" };
        format!(
            "server_name: {name}
listen: {listen}
http: {http}

jetstream {{
  store_dir: {store_dir}
  max_memory_store: 64MB
  max_file_store: 1GB
}}

tls {{
  cert_file: {cert}
  key_file: {key}
  ca_file: {ca}
  timeout: 5
{verify}}}

accounts {{
  ANNAL {{
    jetstream: enabled
    users: [
      {{ user: {user}, password: {password} }}
      {{ nkey: {nkey} }}
    ]
  }}
  OTHER {{
    jetstream: enabled
    users: [ {{ user: {other_user}, password: {other_password} }} ]
  }}
}}

cluster {{
  name: {cluster_name}
  listen: {cluster_listen}
  authorization {{
    user: \"route\"
    password: {route_password}
  }}
  routes: [
{routes}  ]
}}
",
            name = quote(&node.name),
            listen = quote(&format!("127.0.0.1:{}", node.client_port)),
            http = quote(&format!("127.0.0.1:{}", node.http_port)),
            store_dir = quote_path(&node.dir.join("js")),
            cert = quote_path(&self.tls.server_cert),
            key = quote_path(&self.tls.server_key),
            ca = quote_path(&self.tls.ca),
            user = quote(&self.user.0),
            password = quote(&self.user.1),
            nkey = quote(&self.nkey_user.public_key()),
            other_user = quote(&self.other_user.0),
            other_password = quote(&self.other_user.1),
            cluster_name = quote(CLUSTER_NAME),
            cluster_listen = quote(&format!("127.0.0.1:{}", node.cluster_port)),
            route_password = quote(&self.route_password),
        )
    }

    fn spawn(&self, i: usize) {
        let node = &self.nodes[i];
        let log = OpenOptions::new().create(true).append(true).open(&node.log).expect("open server log");
        let stderr = log.try_clone().expect("clone server log handle");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} for {}: {e}", self.binary.display(), node.name));
        *self.child(i) = Some(child);
    }

    fn stop_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    fn poll_ready(&self) -> Result<(), NotReady> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for i in 0..NODES {
                let status = self.child(i).as_mut().and_then(|child| child.try_wait().ok().flatten());
                if let Some(status) = status {
                    return Err(NotReady::Exited { node: i, status });
                }
            }
            let state = match self.readiness() {
                Ok(()) => return Ok(()),
                Err(state) => state,
            };
            if Instant::now() >= deadline {
                return Err(NotReady::Timeout { state });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// `Ok` when every running node is healthy and all name the same running meta leader, else a description.
    fn readiness(&self) -> Result<(), String> {
        let running: Vec<usize> = (0..NODES).filter(|&i| self.is_running(i)).collect();
        let mut leaders = Vec::new();
        let mut state = String::new();
        for &i in &running {
            let name = &self.nodes[i].name;
            match self.monitor_get(i, "/healthz") {
                Ok((200, body)) if body.contains(r#""status":"ok""#) => {}
                Ok((status, body)) => {
                    let _ = writeln!(state, "{name}: /healthz {status} {}", body.trim());
                    continue;
                }
                Err(e) => {
                    let _ = writeln!(state, "{name}: /healthz {e}");
                    continue;
                }
            }
            match self.reported_leader(i) {
                Some(leader) => {
                    let _ = writeln!(state, "{name}: meta leader {leader}");
                    leaders.push(leader);
                }
                None => {
                    let _ = writeln!(state, "{name}: no meta leader");
                }
            }
        }
        let agreed = leaders.len() == running.len()
            && leaders.windows(2).all(|w| w[0] == w[1])
            && leaders.first().is_some_and(|leader| running.iter().any(|&i| self.nodes[i].name == *leader));
        if agreed {
            Ok(())
        } else {
            Err(state)
        }
    }

    fn fail(&self, reason: NotReady) -> ! {
        let mut message = match reason {
            NotReady::Exited { node, status } => {
                format!("nats-server {} exited ({status}) before the cluster was ready\n", self.nodes[node].name)
            }
            NotReady::Timeout { state } => {
                format!("nats-server cluster not ready after {READY_TIMEOUT:?}; last state:\n{state}")
            }
        };
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = write!(
                message,
                "\n--- {} (client {}, cluster {}, http {}; {}) ---\n{}\n",
                node.name,
                node.client_port,
                node.cluster_port,
                node.http_port,
                node.log.display(),
                self.log_tail(i),
            );
        }
        panic!("{message}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Kills a server process and waits for it so no server outlives its test.
fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn find_server() -> PathBuf {
    let path_dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nats-server not found on PATH, in /usr/sbin or in /usr/bin; \
                 install it with `bash jetstream/install-server.sh` (Debian package nats-server 2.9)"
            )
        })
}

/// Generates a CA, a server certificate for `localhost`/`127.0.0.1` and a client certificate, all EC P-256.
fn generate_tls(dir: &Path) -> TlsFiles {
    fs::create_dir_all(dir).expect("create TLS directory");
    fs::write(dir.join("openssl.cnf"), OPENSSL_CONFIG).expect("write openssl.cnf");
    let genkey =
        |key: &str| openssl(dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key]);
    genkey("ca-key.pem");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca-key.pem",
            "-sha256",
            "-days",
            CERT_DAYS,
            "-subj",
            "/CN=annal test CA",
            "-config",
            "openssl.cnf",
            "-extensions",
            "ca",
            "-out",
            "ca.pem",
        ],
    );
    for name in ["server", "client"] {
        let (key, csr, cert) = (format!("{name}-key.pem"), format!("{name}.csr"), format!("{name}.pem"));
        let subject = format!("/CN=annal test {name}");
        genkey(&key);
        openssl(dir, &["req", "-new", "-key", &key, "-subj", &subject, "-config", "openssl.cnf", "-out", &csr]);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-CAserial",
                "ca.srl",
                "-days",
                CERT_DAYS,
                "-sha256",
                "-extfile",
                "openssl.cnf",
                "-extensions",
                name,
                "-out",
                &cert,
            ],
        );
    }
    TlsFiles {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run openssl (needed to generate test certificates): {e}"));
    if !output.status.success() {
        panic!(
            "openssl {} failed ({}):\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
    }
}

/// Binds `n` loopback listeners on port 0 at once (so the ports are distinct) and returns their ports.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("listener address").port()).collect()
}

/// A random hex string for passwords.
fn secret() -> String {
    let state = RandomState::new();
    format!("{:016x}{:016x}", state.hash_one(1u8), state.hash_one(2u8))
}

/// A double-quoted string for the nats-server configuration format.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn quote_path(path: &Path) -> String {
    quote(path.to_str().expect("temporary paths are UTF-8"))
}

fn append(path: &Path, text: &str) {
    let mut file = OpenOptions::new().create(true).append(true).open(path).expect("open server log");
    file.write_all(text.as_bytes()).expect("append to server log");
}

/// A minimal HTTP/1.0 GET on a loopback port; returns the status code and body.
fn http_get(port: u16, path: &str) -> io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad HTTP response: {response:?}")))?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// Extracts `meta_cluster.leader` from a `/jsz` body; the field is absent while there is no leader.
fn meta_leader_in_jsz(body: &str) -> Option<String> {
    let meta = &body[body.find(r#""meta_cluster""#)?..];
    let meta = &meta[..meta.find('}')?];
    let rest = &meta[meta.find(r#""leader""#)? + r#""leader""#.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    let leader = &rest[..rest.find('"')?];
    (!leader.is_empty()).then(|| leader.to_string())
}

/// Every event of a shared log's host's files, read offline with chain key `key`, and
/// its projection digests: what two hosts that folded the same stream hold alike.
pub fn host_files(path: &Path, key: [u8; 32]) -> (Vec<annal::StoredEvent>, Vec<annal::TableDigest>) {
    let reader = annal::Reader::open(path, annal::Limits::default(), Some(key)).unwrap();
    let mut out = Vec::new();
    let mut from_seq = 1;
    loop {
        let page = reader.events(annal::EventQuery { from_seq, max_events: 512, max_bytes: 8 << 20 }).unwrap();
        out.extend(page.events);
        if !page.has_more {
            break;
        }
        from_seq = page.next_seq;
    }
    (out, reader.projection_digests().unwrap())
}
