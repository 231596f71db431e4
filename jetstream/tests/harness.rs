//! Checks the test cluster itself, without a NATS client library: monitoring endpoints, the plaintext INFO line the
//! servers send before the TLS handshake, and killing and restarting nodes.

mod cluster;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::time::Duration;

use cluster::{Cluster, ClusterOptions, NODES};

/// Reads the `INFO {...}` line node `i` sends to a new client connection.
fn read_info(cluster: &Cluster, i: usize) -> String {
    let stream = TcpStream::connect(cluster.client_addr(i)).expect("connect to client port");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).expect("read INFO line");
    line
}

fn assert_healthy(cluster: &Cluster, i: usize) {
    let (status, body) = cluster.monitor_get(i, "/healthz").expect("GET /healthz");
    assert_eq!(status, 200, "node {i} /healthz: {body}\n{}", cluster.log_tail(i));
    assert!(body.contains(r#""status":"ok""#), "node {i} /healthz: {body}");
}

#[test]
fn cluster_starts_with_a_meta_leader() {
    let cluster = Cluster::start();

    let leaders: Vec<String> = (0..NODES)
        .map(|i| {
            assert_healthy(&cluster, i);
            cluster.reported_leader(i).unwrap_or_else(|| panic!("node {i} reports no meta leader"))
        })
        .collect();
    assert!(leaders.iter().all(|l| *l == leaders[0]), "nodes disagree on the meta leader: {leaders:?}");
    let leader = cluster.meta_leader().expect("an agreed meta leader");
    assert_eq!(cluster.server_name(leader), leaders[0]);

    let urls = cluster.urls();
    assert_eq!(urls.len(), NODES);
    assert!(urls.iter().all(|u| u.starts_with("tls://127.0.0.1:")), "{urls:?}");
    assert!(cluster.ca_file().is_file());
    let (cert, key) = cluster.client_cert();
    assert!(cert.is_file() && key.is_file());
    assert_eq!(cluster.user().0, "annal");
    assert_eq!(cluster.other_user().0, "other");
    assert_ne!(cluster.user().1, cluster.other_user().1);

    let addr = cluster.client_addr(0);
    drop(cluster);
    assert!(TcpStream::connect(addr).is_err(), "a server is still listening on {addr} after drop");
}

#[test]
fn client_ports_require_tls_and_authorization() {
    let cluster = Cluster::start();
    for i in 0..NODES {
        let info = read_info(&cluster, i);
        assert!(info.starts_with("INFO {"), "node {i}: {info}");
        assert!(info.contains(r#""tls_required":true"#), "node {i}: {info}");
        assert!(info.contains(r#""auth_required":true"#), "node {i}: {info}");
        assert!(info.contains(r#""jetstream":true"#), "node {i}: {info}");
        assert!(!info.contains(r#""tls_verify":true"#), "node {i}: {info}");
    }
}

#[test]
fn verify_clients_requires_client_certificates() {
    let cluster = Cluster::start_with(ClusterOptions { verify_clients: true });
    for i in 0..NODES {
        let info = read_info(&cluster, i);
        assert!(info.contains(r#""tls_verify":true"#), "node {i}: {info}");
    }
}

#[test]
fn killed_nodes_restart_and_rejoin() {
    let mut cluster = Cluster::start();

    cluster.kill(1);
    assert!(!cluster.is_running(1));
    assert_eq!(cluster.urls(), vec![cluster.url(0), cluster.url(2)]);
    assert!(TcpStream::connect(cluster.client_addr(1)).is_err(), "killed node still accepts connections");
    cluster.wait_ready();
    let leader = cluster.meta_leader().expect("survivors agree on a meta leader");
    assert_ne!(leader, 1);
    for i in [0, 2] {
        assert_healthy(&cluster, i);
        assert_eq!(cluster.reported_leader(i).as_deref(), Some(cluster.server_name(leader)));
    }

    cluster.restart(1);
    assert_eq!(cluster.urls().len(), NODES);
    assert_healthy(&cluster, 1);
    let leader = cluster.meta_leader().expect("an agreed meta leader after restart");
    assert_eq!(cluster.reported_leader(1).as_deref(), Some(cluster.server_name(leader)));
    assert!(read_info(&cluster, 1).contains(r#""tls_required":true"#));

    // Losing the meta leader itself forces an election among the two survivors.
    cluster.kill(leader);
    cluster.wait_ready();
    let new_leader = cluster.meta_leader().expect("survivors elect a new meta leader");
    assert_ne!(new_leader, leader);
    cluster.restart(leader);
    assert!(cluster.meta_leader().is_some());
    assert_healthy(&cluster, leader);
}
