//! The HTTP layer under every store: each attempt object_store makes goes
//! through [`Watched`], which
//!
//! - abandons a stalled response: no response head to a request without a
//!   body, or no body bytes, for `idle_timeout` is an `HttpError` of kind
//!   `Timeout`, which object_store retries as it retries any timeout (a GET
//!   resumes its body from the byte where it stopped, pinned to its ETag;
//!   a listing is retried by [`crate::list`]);
//! - remembers, per operation ([`scoped`]), the status of the latest
//!   attempt's response, so an error is classified from the status and the
//!   client's typed errors ([`crate::error`]), never from its text;
//! - counts retries ([`crate::runtime::Stats::retries`]): an attempt that
//!   follows a failed attempt of the same operation (a transport error, a
//!   5xx, 429 or 408 status, a body cut off or stalled).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;
use tokio::time::Sleep;

use crate::runtime::{stats, Stats};

/// What one operation's attempts have seen so far.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    /// The latest attempt failed (a retry is what comes next).
    failed: AtomicBool,
    /// The status of the latest attempt's response; 0 before a response.
    status: AtomicU16,
}

impl Attempts {
    fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }
}

tokio::task_local! {
    static OP: Arc<Attempts>;
}

/// Run `future` as one operation: its attempts are tracked together (the
/// status its errors are classified by, the retries it counts). Scopes
/// nest: the innermost one is the operation.
pub(crate) async fn scoped<F: Future>(future: F) -> F::Output {
    OP.scope(Arc::new(Attempts::default()), future).await
}

fn current() -> Option<Arc<Attempts>> {
    OP.try_with(Arc::clone).ok()
}

/// The HTTP status of the current operation's latest response, if its
/// latest attempt got one.
pub(crate) fn last_status() -> Option<u16> {
    current()
        .map(|a| a.status.load(Ordering::Relaxed))
        .filter(|&s| s != 0)
}

/// True if the current operation's latest attempt got a successful
/// response and failed after it (its body cut off, stalled or refused),
/// which object_store retries for GETs only.
pub(crate) fn failed_after_response() -> bool {
    last_status().is_some_and(|s| (200..300).contains(&s))
}

/// True if `e` (or an error in its source chain) is one of the client's
/// transport errors (connection, timeout, a body cut off or stalled).
pub(crate) fn is_transport(e: &(dyn StdError + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if e.is::<HttpError>() || e.is::<reqwest::Error>() || e.is::<Stalled>() {
            return true;
        }
        at = e.source();
    }
    false
}

/// No bytes for the idle timeout.
#[derive(Debug)]
pub struct Stalled {
    idle: Duration,
    what: &'static str,
}

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} stalled: nothing for {:?} (idle_timeout)",
            self.what, self.idle
        )
    }
}

impl StdError for Stalled {}

fn stalled(idle: Duration, what: &'static str) -> HttpError {
    HttpError::new(HttpErrorKind::Timeout, Stalled { idle, what })
}

/// Builds object_store's own reqwest client and wraps it in [`Watched`].
#[derive(Debug)]
pub(crate) struct Connector {
    pub idle: Duration,
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Watched {
            inner,
            idle: self.idle,
        }))
    }
}

/// The client every store sends its attempts through.
#[derive(Debug)]
struct Watched {
    inner: HttpClient,
    idle: Duration,
}

impl Watched {
    async fn attempt(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let op = current();
        if let Some(op) = &op {
            if op.failed.swap(false, Ordering::Relaxed) {
                Stats::count(&stats().retries, 1);
            }
            op.status.store(0, Ordering::Relaxed);
        }
        // A request that sends a body may take its time sending it: only
        // its response's body is watched (its head is bounded by
        // `timeout`). Any other request's answer must start within the
        // idle timeout.
        let sent = if request.body().is_empty() {
            match tokio::time::timeout(self.idle, self.inner.execute(request)).await {
                Ok(sent) => sent,
                Err(_) => Err(stalled(self.idle, "the response")),
            }
        } else {
            self.inner.execute(request).await
        };
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                if let Some(op) = &op {
                    op.fail();
                }
                return Err(e);
            }
        };
        let status = response.status();
        if let Some(op) = &op {
            op.status.store(status.as_u16(), Ordering::Relaxed);
            if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
                op.fail();
            }
        }
        let (parts, body) = response.into_parts();
        let body = HttpResponseBody::new(IdleBody {
            inner: body,
            idle: self.idle,
            sleep: None,
            op,
        });
        Ok(HttpResponse::from_parts(parts, body))
    }
}

impl HttpService for Watched {
    fn call<'a, 'b>(
        &'a self,
        request: HttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(self.attempt(request))
    }
}

/// A response body that fails with [`Stalled`] when no bytes come for the
/// idle timeout while it is read, and marks its operation failed on any
/// error.
struct IdleBody {
    inner: HttpResponseBody,
    idle: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    op: Option<Arc<Attempts>>,
}

impl IdleBody {
    fn failed(&self) {
        if let Some(op) = &self.op {
            op.fail();
        }
    }
}

impl Body for IdleBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                if matches!(frame, Some(Err(_))) {
                    this.failed();
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let idle = this.idle;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.sleep = None;
                        this.failed();
                        // Abandoned: close its connection now, before the
                        // retry is sent, not when the body is dropped.
                        this.inner = HttpResponseBody::from(Bytes::new());
                        Poll::Ready(Some(Err(stalled(idle, "the body"))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
