//! TLS for test servers: a throwaway CA made with `openssl`, a server
//! certificate for 127.0.0.1 and a client certificate, and redis-server
//! arguments that serve TLS on a second port beside the plain one (the
//! plain port stays for redis-cli control).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{RedisServer, free_port, require};

/// A CA and the certificates it signed, in a temporary directory.
pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    /// Generates a CA, a server certificate for `127.0.0.1` / `localhost`
    /// and a client certificate, all signed by the CA.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new(require("openssl"))
                .current_dir(d)
                .args(args)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=ratewatch test CA",
        ];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&ca);
        std::fs::write(
            d.join("server.ext"),
            // clientAuth too: cluster nodes present it to each other on the bus.
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write server.ext");
        std::fs::write(
            d.join("client.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        )
        .expect("write client.ext");
        for (name, cn) in [("server", "127.0.0.1"), ("client", "ratewatch")] {
            let subj = format!("/CN={cn}");
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            let mut req = vec!["req", "-subj", &subj];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr]);
            openssl(&req);
            openssl(&[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                &ext,
                "-out",
                &crt,
            ]);
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// The server certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.path("server.crt")
    }

    /// The server key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    /// The client certificate (PEM).
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.crt")
    }

    /// The client key (PEM).
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// `redis-server` arguments serving TLS on `tls_port` with these
    /// certificates; clients must present a certificate if `auth_clients`.
    /// With `cluster`, the cluster bus and replication use TLS too.
    pub fn server_args(&self, tls_port: u16, auth_clients: bool, cluster: bool) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        let mut args = vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            s(&self.server_cert()),
            "--tls-key-file".into(),
            s(&self.server_key()),
            "--tls-ca-cert-file".into(),
            s(&self.ca()),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ];
        if cluster {
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
        }
        args
    }
}

/// A redis-server serving TLS on `tls_port` (and plain on `server.port`).
pub struct TlsRedis {
    /// The server (plain port for control).
    pub server: RedisServer,
    /// Its TLS port.
    pub tls_port: u16,
}

impl TlsRedis {
    /// Starts a node serving TLS with `certs`.
    pub fn start(certs: &Certs, auth_clients: bool) -> Self {
        let tls_port = free_port();
        let args = certs.server_args(tls_port, auth_clients, false);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self {
            server: RedisServer::start_with(&args),
            tls_port,
        }
    }

    /// `rediss://127.0.0.1:tls_port`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

/// A three-master Redis Cluster serving TLS (clients, bus and replication).
pub struct TlsCluster {
    /// The nodes, plain ports for control.
    pub cluster: super::RedisCluster,
    /// The TLS port of each node, in the same order.
    pub tls_ports: Vec<u16>,
}

impl TlsCluster {
    /// Starts and creates it with `certs`.
    pub fn start(certs: &Certs) -> Self {
        let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cluster =
            super::cluster::start_cluster(3, 0, |i| certs.server_args(tls_ports[i], false, true));
        Self { cluster, tls_ports }
    }

    /// `rediss://127.0.0.1:tls_port` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.tls_ports
            .iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect()
    }
}
