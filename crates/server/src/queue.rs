//! The bounded queue in front of the engine: at most `parallel` sessions generate at once and at
//! most `queue` more requests wait for a slot; anything beyond is refused at once (HTTP 429).
//!
//! A request is first admitted (a [`Ticket`], counted until dropped), then waits for one of the
//! `parallel` slots (a [`Slot`], held while it generates). Dropping either frees its place, so
//! a client that goes away while waiting leaves the queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct Scheduler {
    slots: Arc<Semaphore>,
    /// Generation slots (`--parallel`).
    parallel: usize,
    /// Requests that may wait for a slot (`--queue`).
    queue: usize,
    /// Requests admitted and not yet finished (waiting + generating).
    admitted: AtomicUsize,
    /// Requests holding a slot.
    active: AtomicUsize,
}

/// Queue full: the number of requests already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub waiting: usize,
}

impl Scheduler {
    /// `parallel` must be at least 1 (checked by the caller's options).
    pub fn new(parallel: usize, queue: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(parallel)),
            parallel,
            queue,
            admitted: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
        })
    }

    /// Admits a request if a slot or a place in the queue is free.
    pub fn admit(self: &Arc<Self>) -> Result<Ticket, QueueFull> {
        let capacity = self.parallel + self.queue;
        self.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .map_err(|_| QueueFull {
                waiting: self.waiting(),
            })?;
        Ok(Ticket {
            scheduler: Arc::clone(self),
        })
    }

    /// Requests generating now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Requests admitted but still waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.admitted
            .load(Ordering::Acquire)
            .saturating_sub(self.active())
    }

    pub fn parallel(&self) -> usize {
        self.parallel
    }

    pub fn queue_capacity(&self) -> usize {
        self.queue
    }
}

/// An admitted request; its place is released on drop.
#[derive(Debug)]
pub struct Ticket {
    scheduler: Arc<Scheduler>,
}

impl Ticket {
    /// Waits for a generation slot.
    pub async fn start(self) -> Slot {
        let permit = Arc::clone(&self.scheduler.slots)
            .acquire_owned()
            .await
            .expect("the scheduler never closes its semaphore");
        self.scheduler.active.fetch_add(1, Ordering::AcqRel);
        Slot {
            _permit: permit,
            ticket: self,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.scheduler.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A generation slot; released (and the request's admission with it) on drop.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    ticket: Ticket,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ticket.scheduler.active.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admits_parallel_plus_queue_then_refuses() {
        let s = Scheduler::new(2, 1);
        let a = s.admit().unwrap();
        let b = s.admit().unwrap();
        let c = s.admit().unwrap();
        assert_eq!(s.admit().unwrap_err(), QueueFull { waiting: 3 });
        let slot_a = a.start().await;
        let _slot_b = b.start().await;
        assert_eq!((s.active(), s.waiting()), (2, 1));
        drop(slot_a);
        assert_eq!((s.active(), s.waiting()), (1, 1));
        let _d = s.admit().unwrap();
        drop(c);
        assert_eq!((s.active(), s.waiting()), (1, 1));
    }

    #[tokio::test]
    async fn a_waiting_ticket_gets_the_slot_when_freed() {
        let s = Scheduler::new(1, 1);
        let first = s.admit().unwrap().start().await;
        let second = s.admit().unwrap();
        let waiter = tokio::spawn(second.start());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        let slot = waiter.await.unwrap();
        assert_eq!(s.active(), 1);
        drop(slot);
        assert_eq!((s.active(), s.waiting()), (0, 0));
    }
}
