//! `TRITONSERVER_MetricFamily*`, `TRITONSERVER_Metric*`,
//! `TRITONSERVER_MetricArgs*`: backends' custom metrics, kept in
//! `metrics::custom` and shown on the metrics endpoint.

use std::{ffi::c_char, ptr, sync::Arc};

use crate::metrics::custom::{self, Kind};
use crate::triton_abi::{
    error::{c_str, invalid_arg, non_null, ErrorPtr, TRITONSERVER_Error},
    parameter::{ParamValue as CParam, TRITONSERVER_Parameter},
    types::{ERROR_ALREADY_EXISTS, ERROR_UNSUPPORTED},
};

/// `TRITONSERVER_MetricKind`.
pub const METRIC_KIND_COUNTER: u32 = 0;
pub const METRIC_KIND_GAUGE: u32 = 1;
pub const METRIC_KIND_HISTOGRAM: u32 = 2;

/// Opaque to C.
pub struct TRITONSERVER_MetricFamily(Arc<custom::Family>);
/// Opaque to C.
pub struct TRITONSERVER_Metric(Arc<custom::Metric>);
/// Opaque to C.
#[derive(Default)]
pub struct TRITONSERVER_MetricArgs {
    buckets: Option<Vec<f64>>,
}

fn kind_to_c(kind: Kind) -> u32 {
    match kind {
        Kind::Counter => METRIC_KIND_COUNTER,
        Kind::Gauge => METRIC_KIND_GAUGE,
        Kind::Histogram => METRIC_KIND_HISTOGRAM,
    }
}

fn unsupported(message: String) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_UNSUPPORTED, message)
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricFamilyNew(
    family: *mut *mut TRITONSERVER_MetricFamily,
    kind: u32,
    name: *const c_char,
    description: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(family) {
        let kind = match kind {
            METRIC_KIND_COUNTER => Kind::Counter,
            METRIC_KIND_GAUGE => Kind::Gauge,
            METRIC_KIND_HISTOGRAM => Kind::Histogram,
            other => return Err(invalid_arg(format!("unknown metric kind {other}"))),
        };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name") }?;
        // SAFETY: `description` is null (refused by `c_str`) or a NUL-terminated string the caller
        // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
        // past the call.
        let help = unsafe { c_str(description, "description") }?;
        let created = custom::new_family(name, help, kind)
            .map_err(|e| TRITONSERVER_Error::boxed(ERROR_ALREADY_EXISTS, e))?;
        // SAFETY: `family` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *family = Box::into_raw(Box::new(TRITONSERVER_MetricFamily(created))) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricFamilyDelete(
    family: *mut TRITONSERVER_MetricFamily,
) -> ErrorPtr {
    ffi_entry!({
        if !family.is_null() {
            // SAFETY: `family` is non-null (checked) and came from `Box::into_raw` in the matching
            // New function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(family) });
        }
        ptr::null_mut()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_GetMetricFamilyKind(
    family: *mut TRITONSERVER_MetricFamily,
    kind: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(family, kind) {
        // SAFETY: `kind` is checked non-null above and, by the header's contract, valid for
        // writing one value; `family` is checked non-null above and is a family from
        // `TRITONSERVER_MetricFamilyNew`, not deleted yet.
        unsafe { *kind = kind_to_c((&*family).0.kind) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricArgsNew(
    args: *mut *mut TRITONSERVER_MetricArgs,
) -> ErrorPtr {
    ffi_entry!(non_null(args) {
        // SAFETY: `args` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *args = Box::into_raw(Box::default()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricArgsSetHistogram(
    args: *mut TRITONSERVER_MetricArgs,
    buckets: *const f64,
    buckets_count: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(args) {
        let n =
            usize::try_from(buckets_count).map_err(|_| invalid_arg("buckets_count too large"))?;
        let bounds = if n == 0 {
            Vec::new()
        } else {
            non_null(buckets, "buckets")?;
            // SAFETY: `buckets` is non-null (checked above) and, by the header's contract, points
            // to `n` elements that stay unchanged for the call; they are copied before it returns.
            unsafe { std::slice::from_raw_parts(buckets, n) }.to_vec()
        };
        // SAFETY: `args` is checked non-null above and is metric args from
        // `TRITONSERVER_MetricArgsNew`, not deleted yet.
        unsafe { (*args).buckets = Some(bounds) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricArgsDelete(
    args: *mut TRITONSERVER_MetricArgs,
) -> ErrorPtr {
    ffi_entry!({
        if !args.is_null() {
            // SAFETY: `args` is non-null (checked) and came from `Box::into_raw` in the matching
            // New function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(args) });
        }
        ptr::null_mut()
    })
}

unsafe fn labels_of(
    labels: *const *const TRITONSERVER_Parameter,
    label_count: u64,
) -> Result<Vec<(String, String)>, ErrorPtr> {
    let n = usize::try_from(label_count).map_err(|_| invalid_arg("label_count too large"))?;
    if n > 0 {
        non_null(labels, "labels")?;
    }
    (0..n)
        .map(|i| {
            // SAFETY: `labels` is non-null (checked above) and, per tritonserver.h, an array of
            // `label_count` parameter pointers; `i < n`.
            let p = unsafe { *labels.add(i) };
            non_null(p, "label")?;
            // SAFETY: checked non-null just above; a parameter from `TRITONSERVER_ParameterNew`
            // the caller keeps for the call.
            let p = unsafe { &*p };
            let key = p.name.to_string_lossy().into_owned();
            match &p.value {
                CParam::String(v) => Ok((key, v.to_string_lossy().into_owned())),
                _ => Err(invalid_arg(format!(
                    "label '{key}' must be a string parameter"
                ))),
            }
        })
        .collect()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricNew(
    metric: *mut *mut TRITONSERVER_Metric,
    family: *mut TRITONSERVER_MetricFamily,
    labels: *const *const TRITONSERVER_Parameter,
    label_count: u64,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: the caller's pointers are passed on unchanged under the same contract; null args
        // are allowed there.
        unsafe { TRITONSERVER_MetricNewWithArgs(metric, family, labels, label_count, ptr::null()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricNewWithArgs(
    metric: *mut *mut TRITONSERVER_Metric,
    family: *mut TRITONSERVER_MetricFamily,
    labels: *const *const TRITONSERVER_Parameter,
    label_count: u64,
    args: *const TRITONSERVER_MetricArgs,
) -> ErrorPtr {
    ffi_entry!(non_null(metric, family) {
        // SAFETY: `labels` is null only with a zero count (checked by `labels_of`), else the
        // caller's array of `label_count` parameters, valid for the call (tritonserver.h).
        let labels = unsafe { labels_of(labels, label_count) }?;
        let buckets = if args.is_null() {
            None
        } else {
            // SAFETY: `args` is checked non-null above and is metric args from
            // `TRITONSERVER_MetricArgsNew`, not deleted yet.
            unsafe { (*args).buckets.clone() }
        };
        // SAFETY: `family` is checked non-null above and is a family from
        // `TRITONSERVER_MetricFamilyNew`, not deleted yet.
        let created = unsafe { (*family).0.new_metric(&labels, buckets) }.map_err(invalid_arg)?;
        // SAFETY: `metric` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *metric = Box::into_raw(Box::new(TRITONSERVER_Metric(created))) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricDelete(metric: *mut TRITONSERVER_Metric) -> ErrorPtr {
    ffi_entry!({
        if !metric.is_null() {
            // SAFETY: `metric` is non-null (checked) and came from `Box::into_raw` in the matching
            // New function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(metric) });
        }
        ptr::null_mut()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricValue(
    metric: *mut TRITONSERVER_Metric,
    value: *mut f64,
) -> ErrorPtr {
    ffi_entry!(non_null(metric, value) {
        // SAFETY: `metric` is checked non-null above and is a metric from
        // `TRITONSERVER_MetricNew*`, not deleted yet.
        let v = unsafe { (*metric).0.value() }.map_err(unsupported)?;
        // SAFETY: `value` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *value = v };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricIncrement(
    metric: *mut TRITONSERVER_Metric,
    value: f64,
) -> ErrorPtr {
    ffi_entry!(non_null(metric) {
        // SAFETY: `metric` is checked non-null above and is a metric from
        // `TRITONSERVER_MetricNew*`, not deleted yet.
        unsafe { (*metric).0.increment(value) }.map_err(invalid_arg)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricSet(
    metric: *mut TRITONSERVER_Metric,
    value: f64,
) -> ErrorPtr {
    ffi_entry!(non_null(metric) {
        // SAFETY: `metric` is checked non-null above and is a metric from
        // `TRITONSERVER_MetricNew*`, not deleted yet.
        unsafe { (*metric).0.set(value) }.map_err(unsupported)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricObserve(
    metric: *mut TRITONSERVER_Metric,
    value: f64,
) -> ErrorPtr {
    ffi_entry!(non_null(metric) {
        // SAFETY: `metric` is checked non-null above and is a metric from
        // `TRITONSERVER_MetricNew*`, not deleted yet.
        unsafe { (*metric).0.observe(value) }.map_err(unsupported)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_GetMetricKind(
    metric: *mut TRITONSERVER_Metric,
    kind: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(metric, kind) {
        // SAFETY: `kind` is checked non-null above and, by the header's contract, valid for
        // writing one value; `metric` is checked non-null above and is a metric from
        // `TRITONSERVER_MetricNew*`, not deleted yet.
        unsafe { *kind = kind_to_c((&*metric).0.kind) };
        Ok(())
    })
}
