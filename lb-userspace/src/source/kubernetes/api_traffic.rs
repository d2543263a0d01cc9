//! What the agent asks of the apiserver and what its watches bring back,
//! counted on the wire: lists (each a full (re)list of a resource), watch
//! requests (a start or a resume from a resourceVersion) and the bookmarks
//! the apiserver sends on them.
//!
//! Why a client layer: kube-runtime's watcher asks for bookmarks
//! (`allowWatchBookmarks=true`) and consumes them itself, moving its
//! resourceVersion on without yielding an event, so nothing above it can see
//! whether they arrive. Without them a watch resumed after its timeout (or a
//! dropped connection) asks for the resourceVersion of the last object it
//! saw, which on a quiet resource can be older than the apiserver's watch
//! cache: 410 Gone and a full relist. Counting them where the bytes pass is
//! the only place left; it changes nothing of what kube does.
//!
//! The apiserver sends each watch event as one JSON object per line, its
//! type first: `{"type":"BOOKMARK","object":{...}}` (metav1.WatchEvent
//! through Go's json.Encoder, which ends every value with a newline). So a
//! bookmark is `{"type":"BOOKMARK"` at the start of the body or right after
//! a newline; the same bytes elsewhere are an object's field (a condition's
//! `type`, say), and a string's newlines and quotes are always escaped.
//!
//! Only requests the apiserver answered with success are counted: a list
//! refused during an outage (and retried with backoff) is not a relist.
use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// How a bookmark event starts, after the newline that ends the event
/// before it (the body's start counts as one).
const BOOKMARK: &[u8] = b"\n{\"type\":\"BOOKMARK\"";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The resource as the URL names it: services, endpointslices, nodes.
    pub resource: String,
}

/// The counters, shared by every apiserver's client (cheap to clone).
#[derive(Clone, Default)]
pub struct ApiTraffic {
    /// First pages of lists: each is a (re)list of the resource.
    pub lists: Family<ResourceLabels, Counter>,
    /// Watch requests: a watch started after a list, or resumed.
    pub watches: Family<ResourceLabels, Counter>,
    /// Bookmarks received on the watches.
    pub bookmarks: Family<ResourceLabels, Counter>,
}

impl ApiTraffic {
    /// Registers the counters (under the registry's `lb_` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubernetes_lists",
            "Lists of a resource the apiserver answered (first pages): the initial list and every relist (after 410 Gone or a change of apiserver)",
            self.lists.clone(),
        );
        registry.register(
            "kubernetes_watches",
            "Watch requests the apiserver accepted: a watch started after a list or resumed from the last resourceVersion",
            self.watches.clone(),
        );
        registry.register(
            "kubernetes_watch_bookmarks",
            "Bookmarks the apiserver sent on the watches (about one a minute per watch): they keep a quiet watch's resourceVersion recent, so a resumed watch needs no relist",
            self.bookmarks.clone(),
        );
    }
}

/// What a request is, from its URL.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    List(String),
    Watch(String),
}

/// A GET of a collection (`/api/v1/services`,
/// `/apis/discovery.k8s.io/v1/endpointslices`,
/// `/api/v1/namespaces/x/services`) with `watch=true` or without a
/// `continue` token; anything else (a probe, a get of one object, a later
/// page) is not counted. (A namespace's subresource,
/// `/api/v1/namespaces/x/status`, would read as a collection; the agent
/// asks for none.)
fn classify(method: &http::Method, uri: &http::Uri) -> Option<Call> {
    if method != http::Method::GET {
        return None;
    }
    let path = uri.path();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // api/v1/<resource> or apis/<group>/<version>/<resource>, optionally
    // with namespaces/<ns> before the resource.
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..)?,
        Some(&"apis") => segments.get(3..)?,
        _ => return None,
    };
    let resource = match rest {
        [r] => *r,
        ["namespaces", _, r] => *r,
        _ => return None,
    };
    let query = uri.query().unwrap_or("");
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    };
    if param("watch").is_some_and(|v| v == "true" || v == "1") {
        Some(Call::Watch(resource.to_string()))
    } else if param("continue").is_none_or(str::is_empty) {
        Some(Call::List(resource.to_string()))
    } else {
        None
    }
}

/// The layer for kube's `ClientBuilder::with_layer`.
#[derive(Clone)]
pub struct TallyLayer(pub ApiTraffic);

impl<S> tower::Layer<S> for TallyLayer {
    type Service = Tally<S>;
    fn layer(&self, inner: S) -> Tally<S> {
        Tally {
            inner,
            traffic: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Tally<S> {
    inner: S,
    traffic: ApiTraffic,
}

impl<S, ReqBody, B> tower::Service<Request<ReqBody>> for Tally<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
{
    type Response = Response<Counted<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let call = classify(req.method(), req.uri());
        let traffic = self.traffic.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            let answered = response.status().is_success();
            let bookmarks = match call {
                Some(Call::List(resource)) if answered => {
                    traffic
                        .lists
                        .get_or_create(&ResourceLabels { resource })
                        .inc();
                    None
                }
                Some(Call::Watch(resource)) if answered => {
                    let labels = ResourceLabels { resource };
                    traffic.watches.get_or_create(&labels).inc();
                    Some(traffic.bookmarks.get_or_create(&labels).clone())
                }
                _ => None,
            };
            Ok(response.map(|body| Counted {
                inner: Box::pin(body),
                bookmarks,
                scanner: Scanner::default(),
            }))
        })
    }
}

/// Finds `BOOKMARK` in a stream of chunks, across chunk boundaries.
struct Scanner {
    /// The last `BOOKMARK.len() - 1` bytes of the previous chunk; at first
    /// a newline, so that an event at the body's start is found too.
    tail: Vec<u8>,
}

impl Default for Scanner {
    fn default() -> Self {
        Self {
            tail: b"\n".to_vec(),
        }
    }
}

impl Scanner {
    /// How many times the pattern ends in `chunk`.
    fn scan(&mut self, chunk: &[u8]) -> u64 {
        let keep = BOOKMARK.len() - 1;
        let mut joined = std::mem::take(&mut self.tail);
        joined.extend_from_slice(chunk);
        let found = joined
            .windows(BOOKMARK.len())
            .filter(|w| *w == BOOKMARK)
            .count() as u64;
        self.tail = joined[joined.len().saturating_sub(keep)..].to_vec();
        found
    }
}

/// A response body that counts the bookmarks passing through it (watch
/// responses only; others pass untouched).
pub struct Counted<B> {
    inner: Pin<Box<B>>,
    bookmarks: Option<Counter>,
    scanner: Scanner,
}

impl<B: HttpBody<Data = Bytes>> HttpBody for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(data), true) = (frame.data_ref(), self.bookmarks.is_some()) {
                let n = self.scanner.scan(data);
                if n > 0 {
                    if let Some(c) = &self.bookmarks {
                        c.inc_by(n);
                    }
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(uri: &str) -> Option<Call> {
        classify(&http::Method::GET, &uri.parse().unwrap())
    }

    #[test]
    fn lists_watches_and_everything_else_are_told_apart_by_the_url() {
        assert_eq!(
            call("/api/v1/services?labelSelector=x&limit=500"),
            Some(Call::List("services".into()))
        );
        assert_eq!(
            call("/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=5&allowWatchBookmarks=true"),
            Some(Call::Watch("endpointslices".into()))
        );
        assert_eq!(
            call("/api/v1/namespaces/a/services?watch=1"),
            Some(Call::Watch("services".into()))
        );
        // A later page of the same list is not another list.
        assert_eq!(call("/api/v1/services?limit=500&continue=abc"), None);
        assert_eq!(
            call("/api/v1/services?limit=500&continue="),
            Some(Call::List("services".into()))
        );
        // One object, a probe, the version: not counted.
        assert_eq!(call("/api/v1/nodes/node-a"), None);
        assert_eq!(call("/api/v1/namespaces/a/services/web"), None);
        assert_eq!(call("/readyz"), None);
        assert_eq!(call("/version"), None);
        assert_eq!(
            classify(&http::Method::POST, &"/api/v1/services".parse().unwrap()),
            None
        );
    }

    #[test]
    fn bookmarks_are_found_across_chunk_boundaries_and_never_inside_objects() {
        let stream = concat!(
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"5"}}}"#,
            "\n",
            r#"{"type":"MODIFIED","object":{"status":{"conditions":[{"type":"BOOKMARK"}]}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"metadata":{"annotations":{"a":"x\n{\"type\":\"BOOKMARK\""}}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"metadata":{"annotations":{"a":"\"type\":\"BOOKMARK\""}}}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"7"}}}"#,
            "\n",
            r#"{"type":"MODIFIED","object":{}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#,
            "\n",
        )
        .as_bytes();
        // Every split of the stream into chunks of every size finds the
        // three bookmarks, and nothing inside the objects.
        for size in 1..=stream.len() {
            let mut s = Scanner::default();
            let found: u64 = stream.chunks(size).map(|c| s.scan(c)).sum();
            assert_eq!(found, 3, "chunks of {size} bytes");
        }
    }
}
