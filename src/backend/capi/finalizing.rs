//! Which backend finalizers are running now, so that a shutdown that
//! runs out of time can say which one hangs.

use std::sync::Mutex;

static RUNNING: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Marks a finalizer as running for as long as it lives.
pub struct Finalizing(u64);

impl Finalizing {
    pub fn enter(what: String) -> Self {
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, what));
        Self(id)
    }
}

impl Drop for Finalizing {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != self.0);
    }
}

/// The finalizers running now, e.g. `TRITONBACKEND_ModelFinalize (model 'x')`.
pub fn running() -> Vec<String> {
    RUNNING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(_, w)| w.clone())
        .collect()
}
