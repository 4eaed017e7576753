//! The HTTP layer under every store: each attempt object_store makes goes
//! through [`Watched`], which remembers, per operation ([`scoped`]), the
//! status of the latest attempt's response, so an error is classified from
//! the status and the client's typed errors ([`crate::error`]), never from
//! its text.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// What one operation's attempts have seen so far.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    /// The status of the latest attempt's response; 0 before a response.
    status: AtomicU16,
}

tokio::task_local! {
    static OP: Arc<Attempts>;
}

/// Run `future` as one operation: its attempts are tracked together (the
/// status its errors are classified by). Scopes nest: the innermost one is
/// the operation.
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

/// True if `e` (or an error in its source chain) is one of the client's
/// transport errors (connection, timeout, a body cut off).
pub(crate) fn is_transport(e: &(dyn StdError + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if e.is::<HttpError>() || e.is::<reqwest::Error>() {
            return true;
        }
        at = e.source();
    }
    false
}

/// Builds object_store's own reqwest client and wraps it in [`Watched`].
#[derive(Debug)]
pub(crate) struct Connector;

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Watched { inner }))
    }
}

/// The client every store sends its attempts through.
#[derive(Debug)]
struct Watched {
    inner: HttpClient,
}

impl Watched {
    async fn attempt(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let op = current();
        if let Some(op) = &op {
            op.status.store(0, Ordering::Relaxed);
        }
        let response = self.inner.execute(request).await?;
        if let Some(op) = &op {
            op.status
                .store(response.status().as_u16(), Ordering::Relaxed);
        }
        Ok(response)
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
