//! The open connections: how many there are, which have a request in progress, and a way to
//! close the one idle the longest when the limit is reached, so idle keep-alive connections
//! never lock out a new client (or a `/health` probe).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

/// One connection as the registry sees it.
#[derive(Debug)]
pub struct Connection {
    /// Requests on this connection whose answer is not finished (HTTP/1: 0 or 1).
    in_flight: AtomicUsize,
    /// Milliseconds since the registry started when the connection was last busy.
    last_busy_ms: AtomicU64,
    /// Requests started on this connection.
    requests: AtomicU64,
    /// Bytes have arrived since the last request started (a request may be on its way).
    pub received: AtomicBool,
    /// Signalled when the connection must close (evicted or shutting down).
    pub close: Notify,
}

/// How long after its last answer an idle connection is still closed gracefully (letting
/// hyper flush the answer's last bytes) rather than dropped.
const FLUSH_MS: u64 = 200;

impl Connection {
    pub fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }
}

#[derive(Debug)]
pub struct Connections {
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    start: Instant,
    /// Signalled whenever a connection leaves the registry.
    pub left: Notify,
    /// Set by [`Connections::close_all`].
    stopping: AtomicBool,
}

impl Connections {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            start: Instant::now(),
            left: Notify::new(),
            stopping: AtomicBool::new(false),
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Registers a new connection; it counts until [`Connections::remove`].
    pub fn add(&self) -> (u64, Arc<Connection>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            in_flight: AtomicUsize::new(0),
            last_busy_ms: AtomicU64::new(self.now_ms()),
            requests: AtomicU64::new(0),
            received: AtomicBool::new(false),
            close: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&connection));
        (id, connection)
    }

    pub fn remove(&self, id: u64) {
        let removed = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if removed.is_some() {
            self.left.notify_waiters();
        }
    }

    /// Closes the connection idle the longest (no request in progress) and drops it from the
    /// count at once. False when every connection has a request in progress.
    pub fn evict_longest_idle(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let oldest = open
            .iter()
            .filter(|(_, c)| c.is_idle())
            .min_by_key(|(_, c)| c.last_busy_ms.load(Ordering::Acquire))
            .map(|(&id, _)| id);
        let Some(connection) = oldest.and_then(|id| open.remove(&id)) else {
            return false;
        };
        drop(open);
        connection.close.notify_one();
        true
    }

    /// Asks every connection to close once its request in progress is answered.
    pub fn close_all(&self) {
        self.stopping.store(true, Ordering::Release);
        for connection in self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            connection.close.notify_one();
        }
    }

    /// True when `connection` can be dropped at once, its socket closed, without cutting an
    /// answer short: no request in progress, and none ever or the last one answered a while
    /// ago. On a stop, a new connection with a request on its way is kept, so that the
    /// request gets its 503.
    pub fn can_drop(&self, connection: &Connection) -> bool {
        let requests = connection.requests.load(Ordering::Acquire);
        let arriving = requests == 0 && connection.received.load(Ordering::Acquire);
        connection.is_idle()
            && !(arriving && self.stopping.load(Ordering::Acquire))
            && (requests == 0
                || self.now_ms() >= connection.last_busy_ms.load(Ordering::Acquire) + FLUSH_MS)
    }

    /// Marks a request in progress on `connection` until the returned guard is dropped.
    pub fn busy(self: &Arc<Self>, connection: &Arc<Connection>) -> Busy {
        connection.in_flight.fetch_add(1, Ordering::AcqRel);
        connection.requests.fetch_add(1, Ordering::AcqRel);
        connection.received.store(false, Ordering::Release);
        connection
            .last_busy_ms
            .store(self.now_ms(), Ordering::Release);
        Busy {
            registry: Arc::clone(self),
            connection: Arc::clone(connection),
        }
    }
}

/// A request in progress; held by the response body until it is sent.
#[derive(Debug)]
pub struct Busy {
    registry: Arc<Connections>,
    connection: Arc<Connection>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.connection
            .last_busy_ms
            .store(self.registry.now_ms(), Ordering::Release);
        self.connection.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_longest_idle_and_never_a_busy_one() {
        let registry = Connections::new();
        let (_, first) = registry.add();
        let (_, second) = registry.add();
        let busy = registry.busy(&first);
        assert!(registry.can_drop(&second), "never used");
        assert!(!registry.can_drop(&first), "busy");
        assert!(registry.evict_longest_idle());
        assert_eq!(registry.len(), 1);
        assert!(!registry.evict_longest_idle(), "the busy one stays");
        drop(busy);
        assert!(first.is_idle() && second.is_idle());
        assert!(
            !registry.can_drop(&first),
            "just answered: closed gracefully"
        );
        assert!(registry.evict_longest_idle());
        assert_eq!(registry.len(), 0);
    }
}
