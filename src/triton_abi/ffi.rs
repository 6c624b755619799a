//! The guard every exported C function runs its body under, so that no
//! panic crosses the C boundary, and that refuses the null pointers an
//! entry point declares required.
//!
//! A panic that escapes an `extern "C"` function aborts the process (Rust
//! 1.81 and later; undefined behaviour before): one backend passing an
//! argument that trips an unforeseen panic would take the whole server
//! down. [`ffi_entry!`] catches it instead: a function returning
//! `TRITONSERVER_Error*` returns an INTERNAL error naming the function and
//! the panic's message, and every other function returns the fallback its
//! definition names (null, false, 0, a static string), which is what it
//! returns for a bad argument anyway. Either way the panic is logged with
//! `tracing::error!`.
//!
//! On the happy path the guard costs nothing measurable: `catch_unwind`
//! is a landing pad, no allocation, and the function's name is only
//! worked out once a panic happened.
//!
//! After a caught panic, the objects the call was changing may be left
//! half-updated (a response missing an output, say); Rust's own guarantees
//! keep that memory-safe, and the backend learns of it through the error.

use std::{
    any::Any,
    panic::{catch_unwind, AssertUnwindSafe},
    ptr,
};

use super::error::{internal, invalid_arg, ErrorPtr};

/// A `TRITONSERVER_Server*` as the backend side holds it: opaque. The
/// in-process front end's server object is cast to it when the server
/// installs it (`backend::capi::settings::set_server`), and back when a
/// backend hands it to a `TRITONSERVER_*` function; C backends see the
/// same address either way.
#[repr(C)]
pub struct ServerHandle {
    _opaque: [u8; 0],
}

/// A table of exported functions' addresses, kept `#[used]` so the linker
/// keeps the objects that define them (see `backend::capi::keep_exported`).
pub struct Exported(pub &'static [*const ()]);

// SAFETY: code addresses, never written or dereferenced.
unsafe impl Sync for Exported {}

/// Runs the body of an exported function under the guard:
/// `ffi_entry!({ .. })` for a function returning `TRITONSERVER_Error*`
/// (the body yields `Result<(), ErrorPtr>` or `ErrorPtr`; a panic becomes
/// an INTERNAL error, see [`guard`]), `ffi_entry!(FALLBACK, { .. })` for
/// any other return type (a panic returns FALLBACK, see [`guard_or`]).
///
/// Either form may name the pointer arguments that must not be null,
/// before the body: `ffi_entry!(non_null(request, id) { .. })`. They are
/// checked in that order before the body runs; the first null one fails
/// the call with INVALID_ARG "`<name>` is null" (or returns FALLBACK).
/// `p as "text"` names the argument differently in that message (Triton's
/// name where it differs from the parameter's).
///
/// The body is a closure's, so `return` and `?` leave the body, not the
/// function, exactly as with the `status((|| { .. })())` form it replaced.
macro_rules! ffi_entry {
    (@what $p:ident) => {
        stringify!($p)
    };
    (@what $p:ident $what:literal) => {
        $what
    };
    (non_null($($p:ident $(as $what:literal)?),+ $(,)?) $body:block) => {{
        // Names the enclosing function in the panic's error (see
        // `ffi::function_name`); never called.
        fn here() {}
        $crate::triton_abi::ffi::guard_non_null(
            here,
            &[$(($p.is_null(), ffi_entry!(@what $p $($what)?))),+],
            || $body,
        )
    }};
    ($body:block) => {{
        // As above.
        fn here() {}
        $crate::triton_abi::ffi::guard(here, || $body)
    }};
    ($fallback:expr, non_null($($p:ident $(as $what:literal)?),+ $(,)?) $body:block) => {{
        // As above.
        fn here() {}
        $crate::triton_abi::ffi::guard_non_null_or(
            here,
            $fallback,
            &[$(($p.is_null(), ffi_entry!(@what $p $($what)?))),+],
            || $body,
        )
    }};
    ($fallback:expr, $body:block) => {{
        // As above.
        fn here() {}
        $crate::triton_abi::ffi::guard_or(here, $fallback, || $body)
    }};
}

/// What a function returning `TRITONSERVER_Error*` may compute: an error
/// pointer, or a `Result` whose `Ok` is success (null).
pub trait IntoErrorPtr {
    fn into_error_ptr(self) -> ErrorPtr;
}

impl IntoErrorPtr for ErrorPtr {
    fn into_error_ptr(self) -> ErrorPtr {
        self
    }
}

impl IntoErrorPtr for Result<(), ErrorPtr> {
    fn into_error_ptr(self) -> ErrorPtr {
        match self {
            Ok(()) => ptr::null_mut(),
            Err(e) => e,
        }
    }
}

/// Runs `body`; a panic becomes an INTERNAL error that names the function
/// `here` is defined in.
#[inline]
pub fn guard<F: Fn(), R: IntoErrorPtr>(here: F, body: impl FnOnce() -> R) -> ErrorPtr {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r.into_error_ptr(),
        Err(payload) => {
            let function = function_name(&here);
            let message = panic_message(payload);
            tracing::error!(function, panic = %message, "a C API call panicked; it returns an INTERNAL error");
            internal(format!("{function}: internal error (panic): {message}"))
        }
    }
}

/// Refuses the first null among `nulls` (whether each required pointer is
/// null, and its name) with INVALID_ARG, else runs `body` under [`guard`].
#[inline]
pub fn guard_non_null<F: Fn(), R: IntoErrorPtr>(
    here: F,
    nulls: &[(bool, &str)],
    body: impl FnOnce() -> R,
) -> ErrorPtr {
    match nulls.iter().find(|(null, _)| *null) {
        Some((_, what)) => invalid_arg(format!("{what} is null")),
        None => guard(here, body),
    }
}

/// As [`guard_non_null`] for other return types: a null returns
/// `fallback`.
#[inline]
pub fn guard_non_null_or<F: Fn(), R>(
    here: F,
    fallback: R,
    nulls: &[(bool, &str)],
    body: impl FnOnce() -> R,
) -> R {
    if nulls.iter().any(|(null, _)| *null) {
        return fallback;
    }
    guard_or(here, fallback, body)
}

/// Runs `body`; a panic returns `fallback`.
#[inline]
pub fn guard_or<F: Fn(), R>(here: F, fallback: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(payload) => {
            let function = function_name(&here);
            let message = panic_message(payload);
            tracing::error!(function, panic = %message, "a C API call panicked; it returns its failure value");
            fallback
        }
    }
}

/// The name of the function a `fn here() {}` item is defined in: its type
/// name is `crate::path::FUNCTION::here`.
fn function_name<F>(_here: &F) -> &'static str {
    let path = std::any::type_name::<F>();
    let path = path.strip_suffix("::here").unwrap_or(path);
    path.rsplit("::").next().unwrap_or(path)
}

/// The text a panic was raised with. The payload is dropped here, and a
/// payload whose own `Drop` panics is leaked rather than let that second
/// panic escape.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic payload is not a string".to_owned()
    };
    if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(second);
    }
    message
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, CStr};

    use super::*;
    use crate::triton_abi::{
        error::{TRITONSERVER_ErrorCode, TRITONSERVER_ErrorDelete, TRITONSERVER_ErrorMessage},
        types::{ERROR_INTERNAL, ERROR_INVALID_ARG},
    };

    /// The code and message of `e`, which is freed.
    fn take(e: ErrorPtr) -> (u32, String) {
        assert!(!e.is_null(), "expected an error");
        // SAFETY: `e` is a live error made by `internal` and freed only
        // below; the message is copied before the free.
        unsafe {
            let out = (
                TRITONSERVER_ErrorCode(e),
                CStr::from_ptr(TRITONSERVER_ErrorMessage(e))
                    .to_string_lossy()
                    .into_owned(),
            );
            TRITONSERVER_ErrorDelete(e);
            out
        }
    }

    /// Panics with `payload`; typed as a body's result.
    fn raise<P: Any + Send + 'static>(payload: P) -> Result<(), ErrorPtr> {
        std::panic::panic_any(payload)
    }

    // The functions under test are `extern "C"`, as the entry points are:
    // a panic escaping one of them aborts the whole test binary, so these
    // tests fail (by crashing) without the guard.

    extern "C" fn returns_error_on_panic(index: usize) -> ErrorPtr {
        ffi_entry!({
            let v: Vec<u8> = Vec::new();
            let _ = v[index];
            Ok(())
        })
    }

    extern "C" fn returns_result(ok: bool) -> ErrorPtr {
        ffi_entry!({
            if ok {
                Ok(())
            } else {
                Err(internal("plain failure"))
            }
        })
    }

    extern "C" fn string_panics(code: u32) -> ErrorPtr {
        ffi_entry!({ raise(format!("backend gave a bad value {code}")) })
    }

    extern "C" fn opaque_payload_panics() -> ErrorPtr {
        ffi_entry!({ raise(17u32) })
    }

    extern "C" fn pointer_or_null(fail: bool) -> *const c_char {
        ffi_entry!(ptr::null(), {
            if fail {
                panic!("pointer flavour");
            }
            c"fine".as_ptr()
        })
    }

    extern "C" fn bool_or_false(fail: bool) -> bool {
        ffi_entry!(false, {
            assert!(!fail, "bool flavour");
            true
        })
    }

    extern "C" fn unit(fail: bool, ran: &std::cell::Cell<bool>) {
        ffi_entry!((), {
            assert!(!fail, "unit flavour");
            ran.set(true);
        })
    }

    extern "C" fn needs_two(first: *const u8, second: *mut u32) -> ErrorPtr {
        ffi_entry!(non_null(first, second as "value") {
            // SAFETY: checked non-null by the guard; the tests pass a local.
            unsafe { *second = u32::from(*first) };
            Ok(())
        })
    }

    extern "C" fn needs_one_or_zero(p: *const u32) -> u32 {
        ffi_entry!(0, non_null(p) {
            // SAFETY: checked non-null by the guard; the tests pass a local.
            unsafe { *p }
        })
    }

    extern "C" fn checked_then_panics(p: *const u8) -> ErrorPtr {
        ffi_entry!(non_null(p) { raise("after the check") })
    }

    #[test]
    fn a_declared_pointer_that_is_null_is_refused_in_order_before_the_body() {
        let (code, message) = take(needs_two(ptr::null(), ptr::null_mut()));
        assert_eq!(
            (code, message.as_str()),
            (ERROR_INVALID_ARG, "first is null")
        );
        let byte = 7u8;
        let (code, message) = take(needs_two(&byte, ptr::null_mut()));
        assert_eq!(
            (code, message.as_str()),
            (ERROR_INVALID_ARG, "value is null")
        );
        let mut value = 0u32;
        assert!(needs_two(&byte, &mut value).is_null());
        assert_eq!(value, 7);
        assert_eq!(needs_one_or_zero(ptr::null()), 0);
        assert_eq!(needs_one_or_zero(&9), 9);
        let (code, message) = take(checked_then_panics(&byte));
        assert_eq!(code, ERROR_INTERNAL);
        assert_eq!(
            message,
            "checked_then_panics: internal error (panic): after the check"
        );
    }

    #[test]
    fn a_panic_becomes_an_internal_error_naming_the_function() {
        let (code, message) = take(returns_error_on_panic(3));
        assert_eq!(code, ERROR_INTERNAL);
        assert!(
            message
                .starts_with("returns_error_on_panic: internal error (panic): index out of bounds"),
            "{message}"
        );
        let (code, message) = take(string_panics(7));
        assert_eq!(code, ERROR_INTERNAL);
        assert_eq!(
            message,
            "string_panics: internal error (panic): backend gave a bad value 7"
        );
        let (_, message) = take(opaque_payload_panics());
        assert_eq!(
            message,
            "opaque_payload_panics: internal error (panic): panic payload is not a string"
        );
    }

    #[test]
    fn without_a_panic_the_body_decides() {
        assert!(returns_result(true).is_null());
        let (code, message) = take(returns_result(false));
        assert_eq!((code, message.as_str()), (ERROR_INTERNAL, "plain failure"));
    }

    #[test]
    fn other_return_types_get_their_fallback() {
        assert!(pointer_or_null(true).is_null());
        // SAFETY: a static C string literal.
        assert_eq!(unsafe { CStr::from_ptr(pointer_or_null(false)) }, c"fine");
        assert!(!bool_or_false(true));
        assert!(bool_or_false(false));
        let ran = std::cell::Cell::new(false);
        unit(true, &ran);
        assert!(!ran.get());
        unit(false, &ran);
        assert!(ran.get());
    }

    #[test]
    fn a_payload_that_panics_when_dropped_is_leaked_not_rethrown() {
        struct Nasty;
        impl Drop for Nasty {
            fn drop(&mut self) {
                panic!("dropping the payload");
            }
        }
        extern "C" fn nasty() -> ErrorPtr {
            ffi_entry!({ raise(Nasty) })
        }
        let (code, _) = take(nasty());
        assert_eq!(code, ERROR_INTERNAL);
    }

    /// Every exported function of the C API runs its body under the
    /// guard: the first thing in the body of each `#[no_mangle] extern "C"`
    /// function under `src/triton_abi`, `src/backend/capi` and
    /// `src/frontend/inprocess` is `ffi_entry!(`. A new entry point without
    /// it fails here.
    #[test]
    fn every_exported_function_is_guarded() {
        fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("capi sources") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for dir in ["triton_abi", "backend/capi", "frontend/inprocess"] {
            sources(&src.join(dir), &mut files);
        }
        let (mut guarded, mut unguarded) = (0, Vec::new());
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read");
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for (at, _) in lines
                .iter()
                .enumerate()
                .filter(|(_, l)| **l == "#[no_mangle]")
            {
                let sig = (at..lines.len())
                    .find(|&i| lines[i].contains("extern \"C\" fn"))
                    .expect("an exported function");
                let name = lines[sig].split("fn ").nth(1).unwrap_or("").to_owned();
                let open = (sig..lines.len())
                    .find(|&i| lines[i].ends_with('{'))
                    .expect("a body");
                let first = lines[open + 1..]
                    .iter()
                    .find(|l| !l.is_empty() && !l.starts_with("//"));
                if first.is_some_and(|l| l.starts_with("ffi_entry!(")) {
                    guarded += 1;
                } else {
                    unguarded.push(format!("{}: {name}", file.display()));
                }
            }
        }
        assert!(unguarded.is_empty(), "not under ffi_entry!: {unguarded:#?}");
        // All of them were found (the reference table lists each once).
        assert!(guarded >= 180, "only {guarded} exported functions found");
    }
}
