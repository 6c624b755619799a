//! The rate limiter (`--rate-limit execution_count`): a model instance
//! executes only once it holds every resource its `instance_group`'s
//! `rate_limiter` asks for, taken when the execution starts and given back
//! when it ends, across models, instances and shards (Triton's
//! `rate_limiter.cc`).
//!
//! Shared state without a shared lock on the request path: each resource
//! (a name on a device, or a `global` name) is a [`Pool`] whose free count
//! is one atomic. An instance takes all of its pools with compare-and-swap
//! in one fixed order and gives back what it took when one is short, so
//! nothing ever blocks while holding a resource. A scheduler that came up
//! short leaves a [`Waiter`] on the pool that was short; whoever gives
//! units back to a pool with waiters rings their bells (the same bell the
//! model's compute workers ring), and they try again. The only mutexes are
//! the registry (model load and unload) and a pool's waiter list, which is
//! touched only when that pool is contended.
//!
//! Fairness, as implemented: when units come back every waiter is woken
//! and the first to take them wins; `priority` is accepted but does not
//! weight the choice (Triton weights its round robin by it).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex, MutexGuard,
    },
};

use futures::task::AtomicWaker;

use crate::proto::inference::{model_instance_group::Kind, ModelConfig, ModelRateLimiter};

/// One `--rate-limit-resource <name>:<count>[:<device>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLimit {
    pub name: String,
    pub count: u32,
    /// `None`: the count holds on every device (and for global resources).
    pub device: Option<u32>,
}

impl ResourceLimit {
    /// Parses tritonserver's syntax; the error is its text.
    pub fn parse(arg: &str) -> Result<Self, String> {
        let err = || {
            format!(
                "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got {arg}"
            )
        };
        let parts: Vec<&str> = arg.split(':').collect();
        let (name, count, device) = match parts.as_slice() {
            [name, count] => (*name, *count, None),
            [name, count, device] => (*name, *count, Some(*device)),
            _ => return Err(err()),
        };
        if name.is_empty() {
            return Err(err());
        }
        let count = count.trim().parse::<u32>().map_err(|_| err())?;
        let device = match device {
            Some(d) => Some(d.trim().parse::<u32>().map_err(|_| err())?),
            None => None,
        };
        Ok(Self {
            name: name.to_owned(),
            count,
            device,
        })
    }
}

/// Where a resource lives: shared by every device, or one device's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Place {
    Global,
    Device(i32),
}

type PoolKey = (Place, String);

/// Resource counts per pool.
type Needs = BTreeMap<PoolKey, u32>;

/// A scheduler's doorbell, left on a short pool.
pub struct Waiter {
    /// Set when a pool it waited on got units back.
    freed: AtomicBool,
    bell: Arc<AtomicWaker>,
}

impl Waiter {
    /// Whether units came back since the last look (and forgets it).
    pub fn take_freed(&self) -> bool {
        self.freed.swap(false, SeqCst)
    }
}

/// One resource's units. `free` may go below zero for a moment when an
/// unload lowers the capacity while an execution holds units.
pub struct Pool {
    free: AtomicI64,
    waiters: Mutex<Vec<Arc<Waiter>>>,
    waiting: AtomicUsize,
}

impl Pool {
    fn new() -> Self {
        Self {
            free: AtomicI64::new(0),
            waiters: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
        }
    }

    fn try_take(&self, n: i64) -> bool {
        let mut free = self.free.load(SeqCst);
        loop {
            if free < n {
                return false;
            }
            match self
                .free
                .compare_exchange_weak(free, free - n, SeqCst, SeqCst)
            {
                Ok(_) => return true,
                Err(now) => free = now,
            }
        }
    }

    /// Gives `n` units back (a negative `n` lowers the capacity) and wakes
    /// whoever waits for them.
    fn give(&self, n: i64) {
        self.free.fetch_add(n, SeqCst);
        // Paired with `wait`: a waiter registers before trying again, so
        // either it sees these units or this sees it.
        if n > 0 && self.waiting.load(SeqCst) > 0 {
            let woken = std::mem::take(&mut *lock(&self.waiters));
            self.waiting.store(0, SeqCst);
            for w in woken {
                w.freed.store(true, SeqCst);
                w.bell.wake();
            }
        }
    }

    fn wait(&self, waiter: &Arc<Waiter>) {
        let mut list = lock(&self.waiters);
        if !list.iter().any(|w| Arc::ptr_eq(w, waiter)) {
            list.push(waiter.clone());
        }
        self.waiting.store(list.len(), SeqCst);
    }
}

/// A poisoned lock only means a panic elsewhere; the data (counts, waker
/// lists) stays consistent, so keep going.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Registry {
    pools: HashMap<PoolKey, (Arc<Pool>, i64)>,
    /// What each registered instance asks for, by model registration.
    models: HashMap<u64, Vec<Needs>>,
    next_id: u64,
}

/// The server's rate limiter: the explicit resource counts and the
/// registry of what the loaded instances ask for.
pub struct RateLimiter {
    explicit: Vec<ResourceLimit>,
    registry: Mutex<Registry>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("explicit", &self.explicit)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub fn new(explicit: Vec<ResourceLimit>) -> Arc<Self> {
        Arc::new(Self {
            explicit,
            registry: Mutex::new(Registry::default()),
        })
    }

    /// Registers the instances of a model being loaded, in the order the
    /// loader creates them. Refused, with Triton's text, when a resource
    /// cannot be provided in the count an instance needs or is asked for
    /// both as global and per device. `bell` wakes the model's scheduler.
    pub fn register(
        self: &Arc<Self>,
        config: &ModelConfig,
        bell: Arc<AtomicWaker>,
    ) -> Result<ModelLimits, String> {
        let asked = instance_limiters(config);
        let needs: Vec<Needs> = asked
            .iter()
            .map(|(device, rl)| instance_needs(*device, rl.as_ref()))
            .collect();
        let mut reg = lock(&self.registry);
        let id = reg.next_id;
        reg.next_id += 1;
        reg.models.insert(id, needs.clone());
        let capacities = match self.capacities(&reg) {
            Ok(c) => c,
            Err(e) => {
                reg.models.remove(&id);
                return Err(e);
            }
        };
        apply(&mut reg, &capacities);
        let instances = needs
            .iter()
            .map(|needs| InstanceClaim {
                take: needs
                    .iter()
                    .filter(|(_, &n)| n > 0)
                    .filter_map(|(key, &n)| reg.pools.get(key).map(|(p, _)| (p.clone(), n as i64)))
                    .collect(),
            })
            .collect();
        drop(reg);
        Ok(ModelLimits {
            limiter: self.clone(),
            id,
            instances,
            waiter: Arc::new(Waiter {
                freed: AtomicBool::new(false),
                bell,
            }),
        })
    }

    fn unregister(&self, id: u64) {
        let mut reg = lock(&self.registry);
        reg.models.remove(&id);
        // Fewer needs can only lower or keep each count: no refusal here.
        let capacities = self.capacities(&reg).unwrap_or_else(|_| max_needs(&reg));
        apply(&mut reg, &capacities);
    }

    /// Each pool's count: the largest any instance needs, or, once any
    /// `--rate-limit-resource` is given, the explicit count (a resource
    /// not given is then 0). Triton's `ParseAndValidateResources`.
    fn capacities(&self, reg: &Registry) -> Result<BTreeMap<PoolKey, u32>, String> {
        let max = max_needs(reg);
        for (place, name) in max.keys() {
            if *place == Place::Global
                && max
                    .keys()
                    .any(|(p, n)| *p != Place::Global && n.as_str() == name.as_str())
            {
                return Err(format!(
                    "Resource \"{name}\" is present as both global and device-specific resource in the model configuration."
                ));
            }
        }
        if self.explicit.is_empty() {
            return Ok(max);
        }
        let mut out = BTreeMap::new();
        for ((place, name), need) in max {
            let given = self
                .explicit
                .iter()
                .filter(|r| r.name == name)
                .filter(|r| match place {
                    // A global resource takes the count given for any device.
                    Place::Global => true,
                    Place::Device(d) => r.device.is_none_or(|rd| i64::from(rd) == i64::from(d)),
                })
                .map(|r| r.count)
                .max()
                .unwrap_or(0);
            if given < need {
                return Err(format!(
                    "Resource count for \"{name}\" is limited to {given} which will prevent scheduling of one or more model instances, the minimum required count is {need}"
                ));
            }
            out.insert((place, name), given);
        }
        Ok(out)
    }
}

fn max_needs(reg: &Registry) -> BTreeMap<PoolKey, u32> {
    let mut max = BTreeMap::new();
    for needs in reg.models.values().flatten() {
        for (key, &n) in needs {
            let m = max.entry(key.clone()).or_insert(0);
            *m = (*m).max(n);
        }
    }
    max
}

/// Moves every pool to its new count; a pool no longer asked for drops to 0.
fn apply(reg: &mut Registry, capacities: &BTreeMap<PoolKey, u32>) {
    for key in capacities.keys() {
        reg.pools
            .entry(key.clone())
            .or_insert_with(|| (Arc::new(Pool::new()), 0));
    }
    for (key, (pool, current)) in reg.pools.iter_mut() {
        let cap = capacities.get(key).map_or(0, |&c| i64::from(c));
        if cap != *current {
            pool.give(cap - *current);
            *current = cap;
        }
    }
}

/// The device and `rate_limiter` of each instance, in the loader's order
/// (`repository::load::instance_devices`): per group, `count` CPU
/// instances, or `count` per listed GPU. A CPU instance is device 0, as in
/// Triton.
fn instance_limiters(config: &ModelConfig) -> Vec<(i32, Option<ModelRateLimiter>)> {
    if config.instance_group.is_empty() {
        return vec![(0, None)];
    }
    let mut out = Vec::new();
    for group in &config.instance_group {
        let count = group.count.max(1) as usize;
        if group.kind == Kind::Gpu as i32 {
            for _ in 0..count {
                out.extend(group.gpus.iter().map(|&g| (g, group.rate_limiter.clone())));
            }
        } else {
            out.extend(std::iter::repeat_n((0, group.rate_limiter.clone()), count));
        }
    }
    out
}

fn instance_needs(device: i32, rl: Option<&ModelRateLimiter>) -> Needs {
    let mut needs = Needs::new();
    for r in rl.map(|r| r.resources.as_slice()).unwrap_or_default() {
        let place = if r.global {
            Place::Global
        } else {
            Place::Device(device)
        };
        // A name given twice: the last count holds, as in Triton's map.
        needs.insert((place, r.name.clone()), r.count);
    }
    needs
}

struct InstanceClaim {
    /// In the pools' key order, the same for every instance, so two
    /// instances never hold each other's first pool while trying a second.
    take: Vec<(Arc<Pool>, i64)>,
}

/// A loaded model's hold on the limiter: what each of its instances takes
/// per execution. Dropping it (the model's scheduler going away) gives its
/// instances' needs up, which may lower the default counts.
pub struct ModelLimits {
    limiter: Arc<RateLimiter>,
    id: u64,
    instances: Vec<InstanceClaim>,
    waiter: Arc<Waiter>,
}

impl ModelLimits {
    /// Takes every resource instance `index` needs, or nothing; short, the
    /// scheduler's bell is left on the short pool.
    pub fn try_acquire(&self, index: usize) -> bool {
        let Some(claim) = self.instances.get(index) else {
            return true;
        };
        // Each round registers on the pool that was short, then tries
        // again (units given back in between would otherwise be missed);
        // short twice on the same pool: the bell covers it.
        let mut registered: Vec<usize> = Vec::new();
        loop {
            match take_all(&claim.take) {
                None => return true,
                Some(short) => {
                    if registered.contains(&short) {
                        return false;
                    }
                    claim.take[short].0.wait(&self.waiter);
                    registered.push(short);
                }
            }
        }
    }

    /// Gives back what instance `index` took for its execution.
    pub fn release(&self, index: usize) {
        if let Some(claim) = self.instances.get(index) {
            for (pool, n) in &claim.take {
                pool.give(*n);
            }
        }
    }

    /// Whether units this scheduler waited for came back.
    pub fn woken(&self) -> bool {
        self.waiter.take_freed()
    }
}

/// Takes all or nothing; on failure, the index of the short pool.
fn take_all(take: &[(Arc<Pool>, i64)]) -> Option<usize> {
    for (i, (pool, n)) in take.iter().enumerate() {
        if !pool.try_take(*n) {
            for (p, n) in &take[..i] {
                p.give(*n);
            }
            return Some(i);
        }
    }
    None
}

impl Drop for ModelLimits {
    fn drop(&mut self) {
        self.limiter.unregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{model_rate_limiter::Resource, ModelInstanceGroup};

    fn group(count: i32, resources: &[(&str, bool, u32)], priority: u32) -> ModelInstanceGroup {
        ModelInstanceGroup {
            kind: Kind::Cpu as i32,
            count,
            rate_limiter: Some(ModelRateLimiter {
                resources: resources
                    .iter()
                    .map(|&(name, global, count)| Resource {
                        name: name.into(),
                        global,
                        count,
                    })
                    .collect(),
                priority,
            }),
            ..Default::default()
        }
    }

    fn model(name: &str, groups: Vec<ModelInstanceGroup>) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            instance_group: groups,
            ..Default::default()
        }
    }

    fn bell() -> Arc<AtomicWaker> {
        Arc::new(AtomicWaker::new())
    }

    #[test]
    fn parses_tritons_resource_syntax() {
        assert_eq!(
            ResourceLimit::parse("R1:4"),
            Ok(ResourceLimit {
                name: "R1".into(),
                count: 4,
                device: None
            })
        );
        assert_eq!(
            ResourceLimit::parse("R1:2:1").map(|r| r.device),
            Ok(Some(1))
        );
        for bad in ["R1", "R1:x", ":2", "R1:2:0:1", "R1:-1", "R1:2:gpu"] {
            let e = ResourceLimit::parse(bad).expect_err(bad);
            assert!(e.contains("--rate-limit-resource option format"), "{e}");
        }
    }

    #[test]
    fn a_single_unit_is_held_by_one_execution_at_a_time_across_models() {
        let limiter = RateLimiter::new(vec![ResourceLimit::parse("R:1").expect("parse")]);
        let a = limiter
            .register(&model("a", vec![group(1, &[("R", false, 1)], 0)]), bell())
            .expect("a");
        let b = limiter
            .register(&model("b", vec![group(1, &[("R", false, 1)], 0)]), bell())
            .expect("b");
        assert!(a.try_acquire(0));
        assert!(!b.try_acquire(0));
        assert!(!a.try_acquire(0));
        a.release(0);
        assert!(b.woken(), "the waiting scheduler is told");
        assert!(!b.woken(), "once");
        assert!(b.try_acquire(0));
        b.release(0);
    }

    #[test]
    fn two_units_let_two_executions_overlap() {
        let limiter = RateLimiter::new(vec![ResourceLimit::parse("R:2").expect("parse")]);
        let a = limiter
            .register(&model("a", vec![group(1, &[("R", false, 1)], 0)]), bell())
            .expect("a");
        let b = limiter
            .register(&model("b", vec![group(1, &[("R", false, 1)], 0)]), bell())
            .expect("b");
        assert!(a.try_acquire(0));
        assert!(b.try_acquire(0));
        a.release(0);
        b.release(0);
    }

    #[test]
    fn default_counts_are_the_largest_need_and_follow_unloads() {
        let limiter = RateLimiter::new(Vec::new());
        let big = limiter
            .register(&model("big", vec![group(1, &[("R", false, 3)], 0)]), bell())
            .expect("big");
        let small = limiter
            .register(
                &model("small", vec![group(2, &[("R", false, 1)], 0)]),
                bell(),
            )
            .expect("small");
        // Count 3: both small instances and nothing for big until they end.
        assert!(small.try_acquire(0));
        assert!(small.try_acquire(1));
        assert!(!big.try_acquire(0));
        small.release(0);
        small.release(1);
        assert!(big.try_acquire(0));
        big.release(0);
        drop(big);
        // Count back to 1: the small instances take turns.
        assert!(small.try_acquire(0));
        assert!(!small.try_acquire(1));
        small.release(0);
    }

    #[test]
    fn all_or_nothing_over_several_resources() {
        let limiter = RateLimiter::new(Vec::new());
        let both = limiter
            .register(
                &model(
                    "both",
                    vec![group(1, &[("A", false, 1), ("B", true, 1)], 0)],
                ),
                bell(),
            )
            .expect("both");
        let b_only = limiter
            .register(&model("b", vec![group(1, &[("B", true, 1)], 0)]), bell())
            .expect("b");
        let a_only = limiter
            .register(&model("a", vec![group(1, &[("A", false, 1)], 0)]), bell())
            .expect("a");
        assert!(b_only.try_acquire(0));
        assert!(!both.try_acquire(0));
        // The failed attempt gave A back.
        assert!(a_only.try_acquire(0));
        a_only.release(0);
        b_only.release(0);
        assert!(both.try_acquire(0));
        both.release(0);
    }

    #[test]
    fn refusals_carry_tritons_text() {
        let limiter = RateLimiter::new(vec![ResourceLimit::parse("R:1").expect("parse")]);
        let Err(e) = limiter.register(&model("m", vec![group(1, &[("R", false, 4)], 0)]), bell())
        else {
            panic!("count 1 < 4 accepted");
        };
        assert_eq!(
            e,
            "Resource count for \"R\" is limited to 1 which will prevent scheduling of one or more model instances, the minimum required count is 4"
        );
        // Only for device 10: nothing on device 0.
        let limiter = RateLimiter::new(vec![ResourceLimit::parse("R:10:10").expect("parse")]);
        let Err(e) = limiter.register(&model("m", vec![group(1, &[("R", false, 4)], 0)]), bell())
        else {
            panic!("device 10 only accepted");
        };
        assert!(e.contains("is limited to 0 "), "{e}");
        // Global takes any device's count.
        let m = limiter.register(&model("g", vec![group(1, &[("R", true, 4)], 0)]), bell());
        assert!(m.is_ok());
        drop(m);
        let limiter = RateLimiter::new(Vec::new());
        let a = limiter
            .register(&model("a", vec![group(1, &[("R", true, 1)], 0)]), bell())
            .expect("a");
        let Err(e) = limiter.register(&model("b", vec![group(1, &[("R", false, 1)], 0)]), bell())
        else {
            panic!("global and per-device accepted");
        };
        assert_eq!(
            e,
            "Resource \"R\" is present as both global and device-specific resource in the model configuration."
        );
        // The refused model left no trace: a per-device need no longer conflicts once `a` goes.
        drop(a);
        assert!(limiter
            .register(&model("b", vec![group(1, &[("R", false, 1)], 0)]), bell())
            .is_ok());
    }

    #[test]
    fn instances_without_resources_always_run() {
        let limiter = RateLimiter::new(Vec::new());
        let m = limiter
            .register(&model("m", Vec::new()), bell())
            .expect("m");
        assert!(m.try_acquire(0));
        assert!(m.try_acquire(0));
    }

    #[test]
    fn concurrent_takers_never_exceed_the_count() {
        let limiter = RateLimiter::new(vec![ResourceLimit::parse("R:2").expect("parse")]);
        let held = Arc::new(AtomicI64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let m = limiter
                    .register(
                        &model(&format!("m{i}"), vec![group(1, &[("R", false, 1)], 0)]),
                        bell(),
                    )
                    .expect("register");
                let held = held.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if m.try_acquire(0) {
                            let now = held.fetch_add(1, SeqCst) + 1;
                            assert!(now <= 2, "{now} holders of a count of 2");
                            held.fetch_sub(1, SeqCst);
                            m.release(0);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
    }
}
