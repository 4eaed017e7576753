//! Responses zt must refuse, played by a scripted HTTP/1.1 server on
//! 127.0.0.1: a server that ignores `If-Match` (or `If-Unmodified-Since`)
//! and serves another version in the middle of a read, a body longer than
//! the range asked for, and a body shorter than it; and faults zt must
//! ride out or name rightly: a response that stalls (before its head or in
//! its body) abandoned after `idle_timeout` and retried, a listing cut off
//! or stalled listed again, errors classified by status and error type
//! whatever the URL spells.
//!
//! Every request gets a fresh connection (`Connection: close`), answered
//! one at a time, so each test's requests are numbered in the order the
//! server saw them.

mod server {
    use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// How long the server waits on a client before giving up on it: a
    /// safety net so that a client that never hangs up fails its test
    /// instead of hanging it. A passing test never waits for it.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// What `Server::finish` sends to stop a server waiting for requests.
    const STOP: &str = "STOP";

    /// One request as the server read it.
    #[derive(Debug, Clone)]
    pub struct Request {
        pub method: String,
        /// Names in lower case.
        pub headers: Vec<(String, String)>,
    }

    impl Request {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }

        /// The byte range asked for (`bytes=A-B`, `bytes=A-`, `bytes=-N`)
        /// in an object of `size` bytes, as `start..end`.
        pub fn range(&self, size: u64) -> Option<std::ops::Range<u64>> {
            let spec = self.header("range")?.strip_prefix("bytes=")?;
            let (first, last) = spec.split_once('-')?;
            if first.is_empty() {
                let n: u64 = last.parse().ok()?;
                return Some(size.saturating_sub(n)..size);
            }
            let start: u64 = first.parse().ok()?;
            let end = match last {
                "" => size,
                last => (last.parse::<u64>().ok()? + 1).min(size),
            };
            Some(start..end)
        }

        /// True for the GET of a range starting at `start`.
        pub fn gets_from(&self, start: u64) -> bool {
            self.method == "GET"
                && self
                    .header("range")
                    .is_some_and(|r| r.starts_with(&format!("bytes={start}-")))
        }
    }

    /// The server's answer to one request.
    pub struct Reply {
        /// `206 Partial Content`, `200 OK`, ...
        pub status: &'static str,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
        /// After the body, wait for the client to hang up instead of
        /// closing: the body announced more than was sent, and closing
        /// would end the exchange for the client. Whether it hangs up shows
        /// whether it stopped reading by itself.
        pub await_hang_up: bool,
        /// Send nothing at all, not even the head: wait for the client to
        /// hang up (a server that stalled before answering).
        pub stall_head: bool,
    }

    impl Reply {
        pub fn set_header(&mut self, name: &str, value: impl ToString) {
            self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
            self.headers.push((name.to_string(), value.to_string()));
        }
    }

    /// What became of one request.
    #[derive(Debug)]
    pub struct Served {
        pub request: Request,
        /// The client closed the connection before the server did (or
        /// while it was still writing).
        pub client_hung_up: bool,
    }

    pub struct Server {
        addr: SocketAddr,
        thread: JoinHandle<Vec<Served>>,
    }

    type Script = dyn Fn(usize, &Request) -> Reply + Send;

    impl Server {
        /// Answer at most `max` requests, the `n`th (from 0) with
        /// `script(n, request)`.
        pub fn start(
            max: usize,
            script: impl Fn(usize, &Request) -> Reply + Send + 'static,
        ) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            let addr = listener.local_addr().expect("local address");
            let thread = std::thread::spawn(move || serve(listener, max, &script));
            Server { addr, thread }
        }

        /// The URL of `path` on this server.
        pub fn url(&self, path: &str) -> String {
            format!("http://{}/{path}", self.addr)
        }

        /// Stop the server and return what it served, in order.
        pub fn finish(self) -> Vec<Served> {
            // Wakes a server waiting for a request; refused if it has
            // already answered its last and closed its socket.
            if let Ok(mut s) = TcpStream::connect(self.addr) {
                let _ = s.write_all(format!("{STOP}\r\n").as_bytes());
            }
            self.thread.join().expect("the server thread panicked")
        }
    }

    fn serve(listener: TcpListener, max: usize, script: &Script) -> Vec<Served> {
        let mut served = Vec::new();
        while served.len() < max {
            let Ok((stream, _)) = listener.accept() else {
                break;
            };
            let _ = stream.set_read_timeout(Some(PATIENCE));
            match read_request(&stream) {
                Incoming::Stop => break,
                // A connection the client dropped before sending anything.
                Incoming::Nothing => continue,
                Incoming::Request(request) => {
                    let reply = script(served.len(), &request);
                    let client_hung_up = answer(&stream, &reply);
                    served.push(Served {
                        request,
                        client_hung_up,
                    });
                }
            }
        }
        served
    }

    enum Incoming {
        Request(Request),
        Stop,
        Nothing,
    }

    fn read_request(stream: &TcpStream) -> Incoming {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return Incoming::Nothing;
        }
        if line.trim_end() == STOP {
            return Incoming::Stop;
        }
        let method = line.split(' ').next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return Incoming::Nothing;
            }
            let text = line.trim_end();
            if text.is_empty() {
                return Incoming::Request(Request { method, headers });
            }
            if let Some((name, value)) = text.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
    }

    /// Send `reply`; true if the client hung up first.
    fn answer(mut stream: &TcpStream, reply: &Reply) -> bool {
        if reply.stall_head {
            return hung_up(stream);
        }
        let mut head = format!("HTTP/1.1 {}\r\n", reply.status);
        for (name, value) in &reply.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("Connection: close\r\n\r\n");
        let sent = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(&reply.body));
        if sent.is_err() {
            return true;
        }
        if !reply.await_hang_up {
            return false;
        }
        hung_up(stream)
    }

    /// Wait for the client to hang up; true if it did (within `PATIENCE`).
    fn hung_up(mut stream: &TcpStream) -> bool {
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        }
    }
}

use std::path::Path;
use std::sync::Arc;

use server::{Reply, Request, Served, Server};
use zt_remote::cache::{cached_copy, entry_path};
use zt_remote::list::{list, Listed};
use zt_remote::object::{BLOCK, HEAD_BYTES};
use zt_remote::{stats, ErrorKind, RemoteConfig, RemoteObject};

/// The object's size: past the head and tail that opening fetches, so the
/// reads after it go to the server.
const SIZE: usize = 2 << 20;
/// What a lying server announces as Content-Length: far more than a test
/// process could buffer.
const HUGE: u64 = 8 << 30;

/// One version of the object the server holds.
struct Version {
    bytes: Vec<u8>,
    etag: Option<&'static str>,
    modified: &'static str,
}

fn version_a(etag: bool) -> Version {
    Version {
        bytes: vec![0xAA; SIZE],
        etag: etag.then_some("\"a\""),
        modified: "Wed, 21 Oct 2015 07:28:00 GMT",
    }
}

fn version_b(etag: bool) -> Version {
    Version {
        bytes: vec![0xBB; SIZE],
        etag: etag.then_some("\"b\""),
        modified: "Thu, 22 Oct 2015 07:28:00 GMT",
    }
}

/// An honest answer from a server holding `version`, which ignores
/// preconditions: 206 with the range asked for, 200 and no body to a HEAD.
fn honest(version: &Version, request: &Request) -> Reply {
    let size = version.bytes.len() as u64;
    let mut reply = Reply {
        status: "200 OK",
        headers: vec![("Last-Modified".into(), version.modified.into())],
        body: Vec::new(),
        await_hang_up: false,
        stall_head: false,
    };
    if let Some(tag) = version.etag {
        reply.set_header("ETag", tag);
    }
    reply.set_header("Content-Length", size);
    if request.method == "HEAD" {
        return reply;
    }
    let range = request.range(size).expect("zt sends ranged GETs");
    reply.status = "206 Partial Content";
    reply.set_header(
        "Content-Range",
        format!("bytes {}-{}/{size}", range.start, range.end - 1),
    );
    reply.set_header("Content-Length", range.end - range.start);
    reply.body = version.bytes[range.start as usize..range.end as usize].to_vec();
    reply
}

/// The honest answer, announcing a `HUGE` body and sending the range and
/// 64 KiB more.
fn longer(version: &Version, request: &Request) -> Reply {
    let mut reply = honest(version, request);
    reply.set_header("Content-Length", HUGE);
    reply.body.extend_from_slice(&[0xEE; 64 << 10]);
    reply.await_hang_up = true;
    reply
}

/// The honest answer's headers (the full range in Content-Range) with half
/// its body, which Content-Length admits to.
fn short(version: &Version, request: &Request) -> Reply {
    let mut reply = honest(version, request);
    reply.body.truncate(reply.body.len() / 2);
    reply.set_header("Content-Length", reply.body.len());
    reply
}

/// One request, no retries (a retry would be a request the script did not
/// plan), 1 MiB parts.
fn config() -> Arc<RemoteConfig> {
    let options = [("max_retries", "0"), ("part_size", "1048576")];
    Arc::new(RemoteConfig::from_options(&options).expect("valid options"))
}

/// A server that answers the two opening GETs from version A and everything
/// after from version B, whatever preconditions the requests carry.
fn replaced_after_open(etags: bool) -> Server {
    let (a, b) = (version_a(etags), version_b(etags));
    Server::start(4, move |n, request| {
        honest(if n < 2 { &a } else { &b }, request)
    })
}

/// The third request, the first after opening, carried `header` with the
/// first version's value: the server was asked to refuse and did not.
fn third_asked_for(served: &[Served], header: &str, value: &str) {
    assert!(served.len() >= 3, "{served:#?}");
    assert_eq!(served[2].request.header(header), Some(value), "{served:#?}");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the cache directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_honest_server_is_read_and_cached() {
    let a = version_a(true);
    let expected = a.bytes.clone();
    let server = Server::start(5, move |_, request| honest(&a, request));
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    assert_eq!(object.etag(), Some("\"a\""));
    let read = object.read(HEAD_BYTES, 4096).expect("read past the head");
    assert_eq!(read, &expected[HEAD_BYTES as usize..][..4096]);
    let dir = tempfile::tempdir().expect("tempdir");
    let entry = cached_copy(&object, dir.path(), u64::MAX).expect("cache the object");
    assert_eq!(std::fs::read(&entry).expect("read the entry"), expected);
    let served = server.finish();
    third_asked_for(&served, "if-match", "\"a\"");
}

#[test]
fn a_server_that_ignores_if_match_cannot_mix_versions() {
    let server = replaced_after_open(true);
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Changed, "{err}");
    assert!(err.to_string().contains("\"b\""), "{err}");
    third_asked_for(&server.finish(), "if-match", "\"a\"");
}

#[test]
fn a_server_without_etags_is_pinned_by_last_modified() {
    let server = replaced_after_open(false);
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    assert_eq!(object.etag(), None);
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Changed, "{err}");
    third_asked_for(
        &server.finish(),
        "if-unmodified-since",
        version_a(false).modified,
    );
}

#[test]
fn another_version_never_lands_in_the_cache() {
    let server = replaced_after_open(true);
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    let dir = tempfile::tempdir().expect("tempdir");
    let err = cached_copy(&object, dir.path(), u64::MAX).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Changed, "{err}");
    assert!(!entry_path(&object, dir.path()).exists());
    // No entry, no partial download left behind: at most the locks.
    let left: Vec<String> = files_in(dir.path())
        .into_iter()
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    third_asked_for(&server.finish(), "if-match", "\"a\"");
}

/// The lying request was answered, and the client hung up on it rather
/// than waiting for the announced body.
fn hung_up_on(served: &[Served], liar: impl Fn(&Request) -> bool) {
    let lie = served
        .iter()
        .find(|s| liar(&s.request))
        .unwrap_or_else(|| panic!("no lying answer in {served:#?}"));
    assert!(
        lie.client_hung_up,
        "the client waited for the body: {served:#?}"
    );
}

#[test]
fn a_body_longer_than_the_range_at_open_is_refused_unread() {
    let a = version_a(true);
    // The head probe lies; the tail probe and the HEAD that follows a bad
    // head probe (is the object empty?) are honest.
    let server = Server::start(3, move |_, request| {
        if request.gets_from(0) {
            longer(&a, request)
        } else {
            honest(&a, request)
        }
    });
    let err = RemoteObject::open(&server.url("m.bin"), config()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BadResponse, "{err}");
    assert!(err.to_string().contains("longer than the range"), "{err}");
    hung_up_on(&server.finish(), |r| r.gets_from(0));
}

#[test]
fn a_body_longer_than_the_range_of_a_read_is_refused_unread() {
    let a = version_a(true);
    let server = Server::start(3, move |n, request| match n {
        0 | 1 => honest(&a, request),
        _ => longer(&a, request),
    });
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BadResponse, "{err}");
    assert!(err.to_string().contains("longer than the range"), "{err}");
    hung_up_on(&server.finish(), |r| r.gets_from(HEAD_BYTES));
}

#[test]
fn a_short_body_is_refused() {
    // At open: the head probe is short.
    let a = version_a(true);
    let server = Server::start(3, move |_, request| {
        if request.gets_from(0) {
            short(&a, request)
        } else {
            honest(&a, request)
        }
    });
    let err = RemoteObject::open(&server.url("m.bin"), config()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BadResponse, "{err}");
    assert!(err.to_string().contains("short body"), "{err}");
    server.finish();
    // In a read after open.
    let a = version_a(true);
    let server = Server::start(3, move |n, request| match n {
        0 | 1 => honest(&a, request),
        _ => short(&a, request),
    });
    let object = RemoteObject::open(&server.url("m.bin"), config()).expect("open");
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BadResponse, "{err}");
    assert!(err.to_string().contains("short body"), "{err}");
    server.finish();
}

// ------------------------------------------------ faults and their outcomes

/// The idle timeout of the stall tests: what each stall costs.
const IDLE: &str = "0.3";

/// `retries` retries, stalls abandoned after `IDLE`, 1 MiB parts.
fn patient(retries: &str) -> Arc<RemoteConfig> {
    let options = [
        ("max_retries", retries),
        ("idle_timeout", IDLE),
        ("part_size", "1048576"),
    ];
    Arc::new(RemoteConfig::from_options(&options).expect("valid options"))
}

/// A reply with `status` and no body.
fn bare(status: &'static str) -> Reply {
    Reply {
        status,
        headers: vec![("Content-Length".into(), "0".into())],
        body: Vec::new(),
        await_hang_up: false,
        stall_head: false,
    }
}

fn retries() -> u64 {
    stats().snapshot().retries
}

#[test]
fn a_network_error_is_not_a_bad_response_whatever_the_url_says() {
    // A port nobody listens on: the connection is refused. The URL (and
    // so the message) says "range" and "416"; the failure is the network.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}/orange/416/range");
    let err = RemoteObject::open(&url, config()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("orange/416"), "{err}");
    // A server error on such a key is a server failure, not a bad response.
    let server = Server::start(2, |_, _| bare("503 Service Unavailable"));
    let err = RemoteObject::open(&server.url("orange/416/range"), config()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io, "{err}");
    server.finish();
}

#[test]
fn a_416_for_a_range_inside_the_object_is_a_bad_response() {
    let a = version_a(true);
    let server = Server::start(3, move |n, request| match n {
        0 | 1 => honest(&a, request),
        _ => {
            let mut reply = bare("416 Range Not Satisfiable");
            reply.set_header("Content-Range", format!("bytes */{SIZE}"));
            reply
        }
    });
    let object = RemoteObject::open(&server.url("data.bin"), config()).expect("open");
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BadResponse, "{err}");
    server.finish();
}

#[test]
fn a_body_that_stalls_is_abandoned_and_resumed() {
    let a = version_a(true);
    let expected = a.bytes.clone();
    // The first read's body stops halfway and the server waits: the client
    // must hang up after the idle timeout and ask for the rest.
    let server = Server::start(4, move |n, request| {
        let mut reply = honest(&a, request);
        if n == 2 {
            reply.body.truncate(reply.body.len() / 2);
            reply.await_hang_up = true;
        }
        reply
    });
    let before = retries();
    let object = RemoteObject::open(&server.url("m.bin"), patient("2")).expect("open");
    let started = std::time::Instant::now();
    let read = object.read(HEAD_BYTES, 4096).expect("the read resumes");
    assert_eq!(read, &expected[HEAD_BYTES as usize..][..4096]);
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    assert!(retries() > before);
    let served = server.finish();
    assert_eq!(served.len(), 4, "{served:#?}");
    assert!(served[2].client_hung_up, "{served:#?}");
    // The rest of the block, pinned to the version opened.
    assert!(
        served[3].request.gets_from(HEAD_BYTES + BLOCK / 2),
        "{served:#?}"
    );
    assert_eq!(served[3].request.header("if-match"), Some("\"a\""));
}

#[test]
fn a_response_that_never_starts_is_abandoned_and_retried() {
    let a = version_a(true);
    let expected = a.bytes.clone();
    let server = Server::start(4, move |n, request| {
        let mut reply = honest(&a, request);
        reply.stall_head = n == 2;
        reply
    });
    let before = retries();
    let object = RemoteObject::open(&server.url("m.bin"), patient("2")).expect("open");
    let read = object.read(HEAD_BYTES, 4096).expect("the read is retried");
    assert_eq!(read, &expected[HEAD_BYTES as usize..][..4096]);
    assert!(retries() > before);
    let served = server.finish();
    assert!(served[2].client_hung_up, "{served:#?}");
    assert!(served[3].request.gets_from(HEAD_BYTES), "{served:#?}");
}

#[test]
fn a_stall_past_the_retries_fails_as_a_network_error_in_bounded_time() {
    let a = version_a(true);
    let server = Server::start(3, move |n, request| {
        let mut reply = honest(&a, request);
        reply.stall_head = n == 2;
        reply
    });
    let object = RemoteObject::open(&server.url("m.bin"), patient("0")).expect("open");
    let started = std::time::Instant::now();
    let err = object.read(HEAD_BYTES, 4096).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("idle_timeout"), "{err}");
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    server.finish();
}

/// An S3 ListObjectsV2 answer naming `data_0.zr` and `meta.zr` under
/// `dir/`.
fn listing_xml() -> Vec<u8> {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
         <Name>b</Name><Prefix>dir/</Prefix><Delimiter>/</Delimiter><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>",
    );
    for (key, size, tag) in [("data_0.zr", 4096, "d0"), ("meta.zr", 96, "m0")] {
        xml.push_str(&format!(
            "<Contents><Key>dir/{key}</Key><LastModified>2026-01-02T03:04:05.000Z</LastModified>\
             <ETag>&quot;{tag}&quot;</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
        ));
    }
    // Padding, so that half the body is a cut inside it.
    xml.push_str(&"<!-- padding -->".repeat(64));
    xml.push_str("</ListBucketResult>");
    xml.into_bytes()
}

#[test]
fn a_listing_cut_short_or_stalled_is_listed_again() {
    // The first answer announces the whole listing and closes halfway
    // through it; the second sends half and stalls; the third is whole.
    let server = Server::start(3, |n, _| {
        let body = listing_xml();
        let mut reply = bare("200 OK");
        reply.set_header("Content-Type", "application/xml");
        reply.set_header("Content-Length", body.len());
        reply.body = body;
        if n < 2 {
            reply.body.truncate(reply.body.len() / 2);
            reply.await_hang_up = n == 1;
        }
        reply
    });
    let endpoint = server.url("");
    let options = [
        ("endpoint", endpoint.trim_end_matches('/')),
        ("access_key_id", "k"),
        ("secret_access_key", "s"),
        ("region", "us-east-1"),
        ("max_retries", "2"),
        ("idle_timeout", IDLE),
    ];
    let config = RemoteConfig::from_options(&options).expect("valid options");
    let before = retries();
    let listed = list("s3://b/dir", &config).expect("listed again until whole");
    assert_eq!(
        listed,
        [
            Listed {
                name: "data_0.zr".into(),
                size: 4096,
                etag: Some("\"d0\"".into())
            },
            Listed {
                name: "meta.zr".into(),
                size: 96,
                etag: Some("\"m0\"".into())
            },
        ]
    );
    assert!(retries() >= before + 2);
    let served = server.finish();
    assert_eq!(served.len(), 3, "{served:#?}");
    assert!(served[1].client_hung_up, "{served:#?}");
    assert!(served.iter().all(|s| s.request.method == "GET"));
}
