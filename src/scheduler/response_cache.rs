//! Triton's response cache (`--cache-config local,size=N`): successful
//! responses of models with `response_cache { enable: true }`, keyed by
//! everything that decides the answer, bounded in bytes with LRU eviction.
//!
//! Not one lock every shard contends on: the cache is split into
//! independent segments, each with its own small mutex, byte budget and
//! LRU list; a key's hash picks its segment, so two shards only meet when
//! they touch the same segment at the same instant, and a critical section
//! is one map probe and a list splice (copies and hashing happen outside).
//! Small caches keep one segment, so eviction is exactly LRU over the whole
//! cache as Triton's local cache does; large ones use up to
//! [`MAX_SEGMENTS`] of at least [`MIN_SEGMENT_BYTES`] each.
//!
//! The key is not a hash (Triton's is, so two requests can collide): it is
//! the request's canonical bytes — model, version, inputs (names,
//! datatypes, shapes, data, in name order), the requested outputs (names
//! and classification counts) and the request parameters that can reach a
//! model — compared in full, so no two different requests share an entry.

use std::{
    collections::{hash_map::RandomState, HashMap},
    hash::{BuildHasher, BuildHasherDefault, Hash, Hasher},
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use crate::types::{InferRequest, InferResponse, ParamValue, Parameters, Tensor};

/// Smallest segment a large cache is split into: an entry must fit in one.
pub const MIN_SEGMENT_BYTES: u64 = 4 << 20;
/// Most segments: with a few dozen shards, collisions stay rare.
pub const MAX_SEGMENTS: usize = 64;
/// Bytes charged per entry and per tensor beyond their data, so that many
/// tiny responses cannot exceed the bound through bookkeeping.
const ENTRY_OVERHEAD: usize = 128;
const TENSOR_OVERHEAD: usize = 64;
/// Request parameters that never reach a model or change its answer: the
/// queue's priority and timeout and the HTTP encoding of the outputs.
const IGNORED_PARAMETERS: [&str; 3] = ["priority", "timeout", "binary_data_output"];

/// A request's identity for the cache: its canonical bytes and their hash.
#[derive(Debug)]
pub struct CacheKey {
    hash: u64,
    bytes: Box<[u8]>,
}

impl PartialEq for CacheKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}
impl Eq for CacheKey {}

impl Hash for CacheKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The map's hasher: the key already carries a keyed SipHash of its bytes.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type KeyMap = HashMap<Arc<CacheKey>, usize, BuildHasherDefault<PreHashed>>;

/// What a hit answers with: the outputs (owned copies, never views of a
/// request's buffers or shared memory) and the response parameters.
#[derive(Debug)]
pub struct CachedResponse {
    outputs: Vec<Tensor>,
    parameters: Parameters,
}

impl CachedResponse {
    /// The response to `request`: the cached outputs under its own id.
    pub fn answer(&self, request: InferRequest, version: &str) -> InferResponse {
        InferResponse {
            model_name: request.model_name,
            model_version: version.to_string(),
            id: request.id,
            outputs: self.outputs.clone(),
            parameters: self.parameters.clone(),
            trace: request.trace,
            compute: Default::default(),
        }
    }
}

/// How an insert ended; Triton counts a miss for all but `AlreadyExists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    Stored,
    /// A concurrent identical request stored it first.
    AlreadyExists,
    /// The entry is larger than a segment (the whole cache when it has one).
    TooLarge {
        bytes: usize,
        limit: usize,
    },
}

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Node {
    entry: Option<(Arc<CacheKey>, Arc<CachedResponse>)>,
    bytes: usize,
    prev: usize,
    next: usize,
}

/// One segment: a map into a slab of nodes linked most recent first.
#[derive(Debug, Default)]
struct Lru {
    map: KeyMap,
    nodes: Vec<Node>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    used: usize,
}

impl Lru {
    fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            ..Default::default()
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        match prev {
            NIL => self.head = next,
            p => self.nodes[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n].prev = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn get(&mut self, key: &CacheKey) -> Option<Arc<CachedResponse>> {
        let i = *self.map.get(key)?;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        self.nodes[i].entry.as_ref().map(|(_, v)| v.clone())
    }

    fn evict_oldest(&mut self) -> bool {
        let i = self.tail;
        if i == NIL {
            return false;
        }
        self.unlink(i);
        if let Some((key, _)) = self.nodes[i].entry.take() {
            self.map.remove(&*key);
        }
        self.used -= self.nodes[i].bytes;
        self.free.push(i);
        true
    }

    fn insert(
        &mut self,
        key: Arc<CacheKey>,
        value: Arc<CachedResponse>,
        bytes: usize,
        limit: usize,
    ) -> Inserted {
        if self.map.contains_key(&*key) {
            return Inserted::AlreadyExists;
        }
        while self.used + bytes > limit {
            if !self.evict_oldest() {
                break;
            }
        }
        let node = Node {
            entry: Some((key.clone(), value)),
            bytes,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.push_front(i);
        self.map.insert(key, i);
        self.used += bytes;
        Inserted::Stored
    }
}

/// A segment on its own cache lines, so two segments' locks never share one.
#[derive(Debug)]
#[repr(align(128))]
struct Segment(Mutex<Lru>);

/// The server's one response cache, shared by every model that enables it.
#[derive(Debug)]
pub struct ResponseCache {
    segments: Box<[Segment]>,
    segment_bytes: usize,
    total_bytes: u64,
    hasher: RandomState,
}

impl ResponseCache {
    /// A cache of `total_bytes`, split by [`segments_for`].
    pub fn new(total_bytes: u64) -> Self {
        Self::with_segments(total_bytes, segments_for(total_bytes))
    }

    pub fn with_segments(total_bytes: u64, segments: usize) -> Self {
        let segments = segments.max(1);
        let segment_bytes = usize::try_from(total_bytes / segments as u64).unwrap_or(usize::MAX);
        Self {
            segments: (0..segments)
                .map(|_| Segment(Mutex::new(Lru::new())))
                .collect(),
            segment_bytes,
            total_bytes,
            hasher: RandomState::new(),
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Bytes held now, summed over segments (for tests and logs).
    pub fn used_bytes(&self) -> usize {
        self.segments.iter().map(|s| lock(s).used).sum::<usize>()
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| lock(s).map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn segment(&self, key: &CacheKey) -> &Segment {
        // High bits pick the segment; the map uses the low ones.
        let i = (key.hash >> 40) as usize % self.segments.len();
        &self.segments[i]
    }

    /// The key of `request` to model `model` version `version`.
    pub fn key(&self, model: &str, version: i64, request: &InferRequest) -> CacheKey {
        let bytes = canonical_bytes(model, version, request);
        let mut h = self.hasher.build_hasher();
        h.write(&bytes);
        CacheKey {
            hash: h.finish(),
            bytes: bytes.into_boxed_slice(),
        }
    }

    pub fn lookup(&self, key: &CacheKey) -> Option<Arc<CachedResponse>> {
        lock(self.segment(key)).get(key)
    }

    /// Stores `response` under `key`. Its outputs are copied first (outside
    /// the lock): a response may hold views of the request's buffers.
    pub fn insert(&self, key: CacheKey, response: &InferResponse) -> Inserted {
        let mut bytes = ENTRY_OVERHEAD + key.bytes.len();
        let outputs: Vec<Tensor> = response
            .outputs
            .iter()
            .map(|t| {
                bytes += TENSOR_OVERHEAD + t.name.len() + 8 * t.shape.len() + t.data.len();
                Tensor::new(
                    t.name.clone(),
                    t.datatype,
                    t.shape.clone(),
                    Bytes::copy_from_slice(&t.data),
                )
            })
            .collect();
        if bytes > self.segment_bytes {
            return Inserted::TooLarge {
                bytes,
                limit: self.segment_bytes,
            };
        }
        let value = Arc::new(CachedResponse {
            outputs,
            parameters: response.parameters.clone(),
        });
        let segment = self.segment(&key);
        lock(segment).insert(Arc::new(key), value, bytes, self.segment_bytes)
    }
}

/// A poisoned segment (a panic while held) still holds a consistent list:
/// every mutation completes before anything that could panic.
fn lock(s: &Segment) -> std::sync::MutexGuard<'_, Lru> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cache a model with `config` uses: the server's (`server`), when
/// the configuration enables it. As in Triton, a model enabling it on a
/// server without a cache loads and runs uncached.
pub fn for_model(
    config: &crate::proto::inference::ModelConfig,
    server: Option<&Arc<ResponseCache>>,
) -> Option<Arc<ResponseCache>> {
    if config.response_cache.as_ref().is_some_and(|c| c.enable) {
        server.cloned()
    } else {
        None
    }
}

/// One segment up to 2 × [`MIN_SEGMENT_BYTES`], then one per
/// [`MIN_SEGMENT_BYTES`], at most [`MAX_SEGMENTS`].
pub fn segments_for(total_bytes: u64) -> usize {
    usize::try_from(total_bytes / MIN_SEGMENT_BYTES)
        .unwrap_or(MAX_SEGMENTS)
        .clamp(1, MAX_SEGMENTS)
}

/// Length-prefixed fields, so no two different requests give the same bytes.
fn canonical_bytes(model: &str, version: i64, request: &InferRequest) -> Vec<u8> {
    let data: usize = request.inputs.iter().map(|t| t.data.len()).sum();
    let mut out = Vec::with_capacity(64 + data + 64 * request.inputs.len());
    let put_str = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    put_str(&mut out, model);
    out.extend_from_slice(&version.to_le_bytes());
    let mut inputs: Vec<&Tensor> = request.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    out.extend_from_slice(&(inputs.len() as u64).to_le_bytes());
    for t in inputs {
        put_str(&mut out, &t.name);
        put_str(&mut out, t.datatype.as_str());
        out.extend_from_slice(&(t.shape.len() as u64).to_le_bytes());
        for d in &t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        out.extend_from_slice(&t.data);
    }
    // No outputs named means all of them: a different request from one
    // naming some, or all, explicitly.
    let mut outputs: Vec<_> = request
        .outputs
        .iter()
        .map(|o| (o.name.as_str(), o.class_count()))
        .collect();
    outputs.sort();
    out.extend_from_slice(&(outputs.len() as u64).to_le_bytes());
    for (name, classes) in outputs {
        put_str(&mut out, name);
        out.extend_from_slice(&classes.map_or(u64::MAX, |c| c).to_le_bytes());
    }
    let params: Vec<_> = request
        .parameters
        .iter()
        .filter(|(k, _)| !IGNORED_PARAMETERS.contains(&k.as_str()))
        .collect();
    out.extend_from_slice(&(params.len() as u64).to_le_bytes());
    for (k, v) in params {
        put_str(&mut out, k);
        match v {
            ParamValue::Bool(b) => {
                out.push(0);
                out.push(u8::from(*b));
            }
            ParamValue::Int(i) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            ParamValue::Uint(u) => {
                out.push(2);
                out.extend_from_slice(&u.to_le_bytes());
            }
            ParamValue::Double(d) => {
                out.push(3);
                out.extend_from_slice(&d.to_bits().to_le_bytes());
            }
            ParamValue::String(s) => {
                out.push(4);
                put_str(&mut out, s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, RequestedOutput};

    fn request(data: &[u8]) -> InferRequest {
        InferRequest {
            model_name: "m".into(),
            inputs: vec![Tensor::new(
                "IN",
                DataType::Uint8,
                vec![1, data.len() as i64],
                Bytes::copy_from_slice(data),
            )],
            ..Default::default()
        }
    }

    fn response(bytes: usize) -> InferResponse {
        InferResponse {
            outputs: vec![Tensor::new(
                "OUT",
                DataType::Uint8,
                vec![1, bytes as i64],
                Bytes::from(vec![7u8; bytes]),
            )],
            ..Default::default()
        }
    }

    #[test]
    fn a_stored_response_answers_the_same_request_only() {
        let cache = ResponseCache::new(1 << 20);
        let key = cache.key("m", 1, &request(b"ab"));
        assert!(cache.lookup(&key).is_none());
        assert_eq!(cache.insert(key, &response(4)), Inserted::Stored);
        let hit = cache.lookup(&cache.key("m", 1, &request(b"ab")));
        let mut req = request(b"ab");
        req.id = "new-id".into();
        let answer = hit.expect("hit").answer(req, "1");
        assert_eq!(answer.id, "new-id");
        assert_eq!(&answer.outputs[0].data[..], &[7u8; 4]);
        assert!(cache.lookup(&cache.key("m", 1, &request(b"ac"))).is_none());
        assert!(cache.lookup(&cache.key("m", 2, &request(b"ab"))).is_none());
        assert!(cache.lookup(&cache.key("n", 1, &request(b"ab"))).is_none());
    }

    #[test]
    fn shape_datatype_outputs_and_parameters_are_part_of_the_key() {
        let cache = ResponseCache::new(1 << 20);
        let base = request(b"abcd");
        let key = |r: &InferRequest| cache.key("m", 1, r).bytes;
        let mut reshaped = base.clone();
        reshaped.inputs[0].shape = vec![2, 2];
        let mut retyped = base.clone();
        retyped.inputs[0].datatype = DataType::Int8;
        let mut one_output = base.clone();
        one_output.outputs.push(RequestedOutput {
            name: "OUT".into(),
            parameters: Default::default(),
        });
        let mut classified = one_output.clone();
        classified.outputs[0]
            .parameters
            .insert("classification".into(), ParamValue::Int(2));
        let mut custom = base.clone();
        custom
            .parameters
            .insert("temperature".into(), ParamValue::Double(0.5));
        let mut queued = base.clone();
        queued
            .parameters
            .insert("priority".into(), ParamValue::Uint(3));
        let all = [
            &base,
            &reshaped,
            &retyped,
            &one_output,
            &classified,
            &custom,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(key(a), key(b));
            }
        }
        assert_eq!(
            key(&base),
            key(&queued),
            "priority does not change the answer"
        );
        let mut renamed = base.clone();
        renamed.inputs[0].name = "IM".into();
        assert_ne!(key(&base), key(&renamed));
    }

    #[test]
    fn input_order_does_not_matter() {
        let cache = ResponseCache::new(1 << 20);
        let mut a = request(b"x");
        a.inputs.push(Tensor::new(
            "B",
            DataType::Uint8,
            vec![1],
            Bytes::from_static(b"y"),
        ));
        let mut b = a.clone();
        b.inputs.reverse();
        assert_eq!(cache.key("m", 1, &a), cache.key("m", 1, &b));
    }

    #[test]
    fn least_recently_used_is_evicted_at_the_bound() {
        // One entry here is ~ 128 + 64 + 3 + 16 + 100 + key (~80) bytes.
        let cache = ResponseCache::with_segments(1000, 1);
        let keys: Vec<_> = (0u8..3).map(|i| request(&[i])).collect();
        for r in &keys[..2] {
            assert_eq!(
                cache.insert(cache.key("m", 1, r), &response(100)),
                Inserted::Stored
            );
        }
        // Touch the first so the second is the oldest.
        assert!(cache.lookup(&cache.key("m", 1, &keys[0])).is_some());
        let third = cache.insert(cache.key("m", 1, &keys[2]), &response(150));
        assert_eq!(third, Inserted::Stored);
        assert!(cache.used_bytes() <= 1000);
        assert!(cache.lookup(&cache.key("m", 1, &keys[0])).is_some());
        assert!(cache.lookup(&cache.key("m", 1, &keys[1])).is_none());
        assert!(cache.lookup(&cache.key("m", 1, &keys[2])).is_some());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn an_entry_larger_than_the_cache_is_refused_and_duplicates_exist() {
        let cache = ResponseCache::with_segments(500, 1);
        let r = request(b"z");
        assert!(matches!(
            cache.insert(cache.key("m", 1, &r), &response(1000)),
            Inserted::TooLarge { .. }
        ));
        assert!(cache.is_empty());
        assert_eq!(
            cache.insert(cache.key("m", 1, &r), &response(10)),
            Inserted::Stored
        );
        assert_eq!(
            cache.insert(cache.key("m", 1, &r), &response(10)),
            Inserted::AlreadyExists
        );
    }

    #[test]
    fn large_caches_are_segmented_and_keep_their_bound_under_threads() {
        assert_eq!(segments_for(1 << 20), 1);
        assert_eq!(segments_for(16 << 20), 4);
        assert_eq!(segments_for(u64::MAX), MAX_SEGMENTS);
        let cache = Arc::new(ResponseCache::with_segments(64 * 1024, 8));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        let mut data = i.to_le_bytes().to_vec();
                        data.push(t % 2);
                        let r = request(&data);
                        let key = cache.key("m", 1, &r);
                        if cache.lookup(&key).is_none() {
                            cache.insert(key, &response(64));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert!(cache.used_bytes() <= 64 * 1024);
        assert!(!cache.is_empty());
    }

    #[test]
    fn cached_outputs_are_copies() {
        let cache = ResponseCache::new(1 << 20);
        let r = request(b"q");
        let resp = response(8);
        let original = resp.outputs[0].data.as_ptr();
        cache.insert(cache.key("m", 1, &r), &resp);
        let hit = cache.lookup(&cache.key("m", 1, &r)).expect("hit");
        assert_ne!(hit.answer(r, "1").outputs[0].data.as_ptr(), original);
    }
}
