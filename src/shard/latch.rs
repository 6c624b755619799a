//! A shard-local one-way latch: tasks wait until it is set (used for
//! shutdown). Single-threaded by construction, so no atomics.

use std::{
    cell::{Cell, RefCell},
    future::poll_fn,
    task::{Poll, Waker},
};

#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl Latch {
    pub fn set(&self) {
        self.set.set(true);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.get() {
                Poll::Ready(())
            } else {
                // Polled again on every wake of a select: register each task once.
                let mut waiters = self.waiters.borrow_mut();
                if !waiters.iter().any(|w| same_task(w, cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}

/// Whether two wakers wake the same task. `Waker::will_wake` alone is not
/// enough on a shard: monoio builds a task's waker vtable inside a generic
/// function, so each codegen unit holds its own copy, and a stored clone
/// of a task's waker and the waker that task is polled with differ in the
/// vtable's address. `will_wake` was false between them on every poll, so
/// a task waiting in a loop (the accept loop's `select!` on shutdown, once
/// per connection) was kept once per wait, without bound. The data pointer
/// is the task (monoio's task header, or an `Arc`'s allocation): the kept
/// waker holds it alive, so no other live waker can have the same one;
/// null (a no-op waker's) is not taken as proof.
pub fn same_task(a: &Waker, b: &Waker) -> bool {
    a.will_wake(b) || (!a.data().is_null() && a.data() == b.data())
}

/// Yields to the shard's other tasks once (monoio has no `yield_now`).
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    /// A task that waits on the latch in a loop beside other work (as the
    /// accept loop does, one `select!` per connection) is held once, not
    /// once per wait: every waker kept is memory until shutdown.
    #[test]
    fn a_task_waiting_again_and_again_is_held_once() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        let held = rt.block_on(async {
            let latch = Rc::new(Latch::default());
            let waiter = latch.clone();
            monoio::spawn(async move {
                for _ in 0..1_000 {
                    monoio::select! {
                        _ = yield_now() => {},
                        _ = waiter.wait() => unreachable!("the latch is not set"),
                    }
                }
                let held = waiter.waiters.borrow().len();
                held
            })
            .await
        });
        assert_eq!(held, 1);
    }
}
