//! The scripted HTTP/1.1 server of the `http_response` target (the ideas of
//! remote/tests/hostile_responses.rs, bounded for a fuzzer): one listener
//! on 127.0.0.1 per process, reused by every input, answering each request
//! with raw bytes taken from the input and closing the connection.
//!
//! The input is up to four responses separated by [`SEPARATOR`], each the
//! exact bytes the server writes (status line, headers, body), picked by
//! what the request asks for rather than by arrival order (open's two
//! probes are concurrent):
//!
//! | part | answers |
//! |------|---------|
//! | 0 | open's head probe, `GET` with `Range: bytes=0-1048575` |
//! | 1 | open's tail probe, `GET` with `Range: bytes=-262144` |
//! | 2 | the `HEAD` open sends when the head probe is refused (an empty object?) |
//! | 3 | every other request: the ranged reads after open |
//!
//! A missing part is an empty answer (the connection closes unanswered).
//! The server closes every connection once its answer is written, so no
//! answer (one announcing more body than it has, one cut mid-header) can
//! keep the client waiting: it sees the end of the stream at once. The
//! client pools no connections, so each request gets a fresh one and the
//! same input is answered the same way every time.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use zt_remote::object::{HEAD_BYTES, TAIL_BYTES};
use zt_remote::RemoteConfig;

/// Between two responses of an input.
pub const SEPARATOR: &[u8] = b"\n~~~~\n";

/// How long the server waits for a request's head: a safety net for a
/// connection that never sends one (the client always does, at once).
const PATIENCE: Duration = Duration::from_secs(2);

/// The largest request head the server reads.
const MAX_REQUEST: usize = 64 << 10;

/// The responses of the input being run.
type Script = Arc<Vec<Vec<u8>>>;

/// The process's server.
pub struct Server {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// Held while an input runs: one input at a time (test threads share
    /// the server).
    turn: Mutex<()>,
}

/// Split an input into its responses.
pub fn split(data: &[u8]) -> Vec<Vec<u8>> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(at) = find(rest, SEPARATOR) {
        parts.push(rest[..at].to_vec());
        rest = &rest[at + SEPARATOR.len()..];
    }
    parts.push(rest.to_vec());
    parts
}

/// Join responses into an input (the seeds' writer).
pub fn join(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.join(SEPARATOR)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The process's server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let script: Arc<Mutex<Script>> = Arc::default();
        let shared = Arc::clone(&script);
        std::thread::Builder::new()
            .name("zt-fuzz-http".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let script = Arc::clone(&shared);
                    let _ = std::thread::Builder::new()
                        .name("zt-fuzz-http-conn".into())
                        .spawn(move || answer(stream, &script));
                }
            })
            .expect("start the server thread");
        Server {
            addr,
            script,
            turn: Mutex::new(()),
        }
    })
}

impl Server {
    /// The URL of `key` on this server.
    pub fn url(&self, key: &str) -> String {
        format!("http://{}/{key}", self.addr)
    }

    /// Answer with `data`'s responses until the returned guard is dropped.
    pub fn play(&self, data: &[u8]) -> MutexGuard<'_, ()> {
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        *self.script.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(split(data));
        turn
    }
}

/// Which response answers a request of `method` with `range`.
pub fn part_for(method: &str, range: Option<&str>) -> usize {
    let head_probe = format!("bytes=0-{}", HEAD_BYTES - 1);
    let tail_probe = format!("bytes=-{TAIL_BYTES}");
    match (method, range) {
        ("HEAD", _) => 2,
        (_, Some(r)) if r == head_probe => 0,
        (_, Some(r)) if r == tail_probe => 1,
        _ => 3,
    }
}

/// Read one request's head, write the script's answer to it, close.
fn answer(mut stream: TcpStream, script: &Mutex<Script>) {
    let _ = stream.set_read_timeout(Some(PATIENCE));
    let _ = stream.set_write_timeout(Some(PATIENCE));
    let _ = stream.set_nodelay(true);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = find(&head, b"\r\n\r\n") {
            break at;
        }
        match stream.read(&mut buf) {
            Ok(n) if n > 0 && head.len() < MAX_REQUEST => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    };
    let text = String::from_utf8_lossy(&head[..end]);
    let mut lines = text.split("\r\n");
    let method = lines
        .next()
        .and_then(|l| l.split(' ').next())
        .unwrap_or_default();
    let range = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("range")
            .then(|| value.trim())
    });
    let part = part_for(method, range);
    let script = Arc::clone(&script.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(response) = script.get(part) {
        let _ = stream.write_all(response);
    }
    // The request had no body, so nothing unread is left: this is a clean
    // end of stream for the client, never a reset.
    let _ = stream.shutdown(Shutdown::Write);
}

/// The client's configuration: no retries (a retry is a request the input
/// did not plan, and waits a backoff), no pooled connections, short limits.
pub fn config() -> Arc<RemoteConfig> {
    static CONFIG: OnceLock<Arc<RemoteConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let options = [
            ("max_retries", "0"),
            ("retry_timeout", "1"),
            ("timeout", "5"),
            ("connect_timeout", "1"),
            ("pool_max_idle_per_host", "0"),
        ];
        Arc::new(RemoteConfig::from_options(&options).expect("valid options"))
    });
    Arc::clone(config)
}
