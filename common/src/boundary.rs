//! The C boundary: [`export!`](crate::export) for every exported function of every crate, and
//! [`guarded!`](crate::guarded) for the guarded twin of an unguarded fast export.
//!
//! A guarded export runs its body inside [`guard`]: a panic is caught, reported through the
//! library's logging hook ([`Library::panicked`]) and turned into the function's failure value,
//! chosen by its return type ([`CReturn::on_panic`]), so unwinding never crosses into C (which
//! would be undefined behaviour). The body's value becomes the C return value by the same trait:
//!
//! | return type | body type                     | `Ok` / value | `Err(e)`                  | panic     |
//! |-------------|-------------------------------|--------------|---------------------------|-----------|
//! | `c_int`     | `Result<(), Library::Error>`  | 0            | [`Library::errno`]`(e)`   | `EIO`     |
//! | `*mut T`    | `*mut T`                      | the pointer  | -                         | NULL      |
//! | `*const T`  | `*const T`                    | the pointer  | -                         | NULL      |
//! | `()`        | `()`                          | -            | -                         | nothing   |
//!
//! An `int` body first runs [`Library::enter`] (libgdsync refuses every call in a forked child
//! there). A function whose failure value is not its type's (libnvm's `nvm_strerror` returns a
//! string, not NULL) names its own with `on_panic(value)`, an expression evaluated only after a
//! panic was caught and reported, and its body is of the return type.
//!
//! The unguarded form (`unguarded`) is for the few exports whose common case is a hot leaf:
//! nothing on it can panic (no allocation, indexing, formatting or unwrap), and every other case
//! goes to an out-of-line twin that runs under [`guarded!`](crate::guarded) with the export's name.
//! Were a panic ever introduced on the unguarded path, the `extern "C"` boundary would abort the
//! process, never unwind into C.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// One library's side of the boundary: its logging hook and its `int` convention.
pub trait Library {
    /// The error of the library's `int`-returning bodies.
    type Error;
    /// Reports a panic caught in `function` (the library's log line).
    fn panicked(function: &str, message: &str);
    /// The `int` an export returns for a body that failed with `e` (logging it if the library
    /// does).
    fn errno(function: &str, e: Self::Error) -> c_int;
    /// Checked before every `int` body; an `Err` is returned as the body's.
    #[inline(always)]
    fn enter(_function: &str) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// A C return type: what an export of this type returns when its body panicked, and how the
/// body's value becomes it. See the module's table.
pub trait CReturn<L: Library>: Sized {
    /// The type of the body of an export returning `Self`.
    type Body;
    /// The value returned when the body panicked.
    fn on_panic() -> Self;
    /// Runs `body` (inside the guard) and converts its value.
    fn finish(function: &str, body: impl FnOnce() -> Self::Body) -> Self;
}

impl<L: Library> CReturn<L> for c_int {
    type Body = Result<(), L::Error>;
    #[inline(always)]
    fn on_panic() -> Self {
        libc::EIO
    }
    #[inline(always)]
    fn finish(function: &str, body: impl FnOnce() -> Self::Body) -> Self {
        match L::enter(function).and_then(|()| body()) {
            Ok(()) => 0,
            Err(e) => L::errno(function, e),
        }
    }
}

impl<L: Library, T> CReturn<L> for *mut T {
    type Body = Self;
    #[inline(always)]
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
    #[inline(always)]
    fn finish(_function: &str, body: impl FnOnce() -> Self) -> Self {
        body()
    }
}

impl<L: Library, T> CReturn<L> for *const T {
    type Body = Self;
    #[inline(always)]
    fn on_panic() -> Self {
        std::ptr::null()
    }
    #[inline(always)]
    fn finish(_function: &str, body: impl FnOnce() -> Self) -> Self {
        body()
    }
}

impl<L: Library> CReturn<L> for () {
    type Body = ();
    #[inline(always)]
    fn on_panic() {}
    #[inline(always)]
    fn finish(_function: &str, body: impl FnOnce()) {
        body()
    }
}

/// Runs `body`; if it panics, calls `report(message)` and returns `on_panic`.
///
/// `AssertUnwindSafe` is sound here: after a panic the body's partial state is never observed
/// again by this call, and shared state that a panic could leave half-updated lives behind mutexes,
/// which poison.
#[inline(always)]
pub fn guard<T>(on_panic: T, report: impl FnOnce(&str), body: impl FnOnce() -> T) -> T {
    guard_else(|| on_panic, report, body)
}

/// [`guard`] whose failure value is made only after a panic was caught and reported (for a value
/// that has an effect, such as setting `errno`).
#[inline(always)]
pub fn guard_else<T>(on_panic: impl FnOnce() -> T, report: impl FnOnce(&str), body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            report(&msg);
            on_panic()
        }
    }
}

/// The body of a guarded export of library `L` named `function`: [`guard`] with the return
/// type's failure value and the library's hook around [`CReturn::finish`]. Inlined, so an
/// export costs nothing over its body when it does not panic (the unwinding landing pad is off
/// the straight-line path).
#[inline(always)]
pub fn run<L: Library, R: CReturn<L>>(function: &str, body: impl FnOnce() -> R::Body) -> R {
    guard(R::on_panic(), |msg| L::panicked(function, msg), || R::finish(function, body))
}

/// Defines exported C functions of one library. The header names the library's
/// [`Library`](crate::boundary::Library) type (its logging hook and `int` convention) and,
/// optionally, the library's C pointer contract, which becomes the `# Safety` section of each
/// `unsafe` export (state it once per crate); then come the functions, written as Rust
/// functions:
///
/// ```ignore
/// gpudirect_common::export! {
///     library = crate::capi::Gdr;
///     safety = "The gdrapi.h pointer contract: see [`crate::capi`].";
///
///     /// Guarded; the body's type and the panic value follow from `c_int`.
///     pub unsafe fn gdr_close(g: GdrT) -> c_int { control::close(g as usize) }
///     /// Guarded, with a failure value of its own; the body is of the return type.
///     on_panic(c"Unknown error".as_ptr()) pub fn nvm_strerror(s: c_int) -> *const c_char { .. }
///     /// Not guarded: a hot leaf whose other cases go to a `guarded!` twin.
///     unguarded pub unsafe fn gdr_copy_to_mapping(..) -> c_int { .. }
/// }
/// ```
///
/// Each becomes `#[unsafe(no_mangle)] pub [unsafe] extern "C" fn`. A block of unguarded exports
/// only may leave out the header. See [`crate::boundary`].
#[macro_export]
macro_rules! export {
    (library = $lib:ty; safety = $safety:literal; $($items:tt)*) => {
        $crate::export!(@items [$lib] [$safety] $($items)*);
    };
    (library = $lib:ty; $($items:tt)*) => {
        $crate::export!(@items [$lib] [] $($items)*);
    };

    (@items [$lib:ty] [$($safety:literal)?]) => {};
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* unguarded $v:vis unsafe fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? $body:block
        $($rest:tt)*
    ) => {
        $crate::export!(@safety [$($safety)?] $(#[$m])* #[unsafe(no_mangle)]
            $v unsafe extern "C" fn $name($($a: $t),*) $(-> $ret)? $body);
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* unguarded $v:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? $body:block
        $($rest:tt)*
    ) => {
        $(#[$m])* #[unsafe(no_mangle)]
        $v extern "C" fn $name($($a: $t),*) $(-> $ret)? $body
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* on_panic($fallback:expr)
        $v:vis unsafe fn $name:ident($($a:ident: $t:ty),* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $crate::export!(@safety [$($safety)?] $(#[$m])* #[unsafe(no_mangle)]
            $v unsafe extern "C" fn $name($($a: $t),*) -> $ret {
                $crate::boundary::guard_else(
                    || $fallback,
                    |msg| <$lib as $crate::boundary::Library>::panicked(stringify!($name), msg),
                    || -> $ret { $body },
                )
            });
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* on_panic($fallback:expr) $v:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$m])* #[unsafe(no_mangle)]
        $v extern "C" fn $name($($a: $t),*) -> $ret {
            $crate::boundary::guard_else(
                || $fallback,
                |msg| <$lib as $crate::boundary::Library>::panicked(stringify!($name), msg),
                || -> $ret { $body },
            )
        }
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* $v:vis unsafe fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? $body:block
        $($rest:tt)*
    ) => {
        $crate::export!(@safety [$($safety)?] $(#[$m])* #[unsafe(no_mangle)]
            $v unsafe extern "C" fn $name($($a: $t),*) $(-> $ret)? {
                $crate::guarded!($lib, stringify!($name), $(-> $ret)? $body)
            });
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };
    (@items [$lib:ty] [$($safety:literal)?]
        $(#[$m:meta])* $v:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? $body:block
        $($rest:tt)*
    ) => {
        $(#[$m])* #[unsafe(no_mangle)]
        $v extern "C" fn $name($($a: $t),*) $(-> $ret)? {
            $crate::guarded!($lib, stringify!($name), $(-> $ret)? $body)
        }
        $crate::export!(@items [$lib] [$($safety)?] $($rest)*);
    };

    // An unsafe export's `# Safety` section: the crate's contract when the header states one
    // (the function's own docs may add to it), else the function's own docs.
    (@safety [$safety:literal] $($f:tt)*) => {
        #[doc = ""]
        #[doc = "# Safety"]
        #[doc = $safety]
        $($f)*
    };
    (@safety [] $($f:tt)*) => { $($f)* };

    // Without a library: unguarded exports only (a guarded one fails: `()` is no `Library`).
    ($($items:tt)+) => {
        $crate::export!(@items [()] [] $($items)+);
    };
}

/// Runs a body as a guarded export of library `$lib` named `$name` would: the panic guard with
/// the return type's failure value and the library's hook, and the return type's conversion
/// (see [`crate::boundary`]). For the out-of-line guarded twin of an `unguarded` export, and for
/// the expansion of [`export!`](crate::export). Without `-> type`, the return type is `()`.
#[macro_export]
macro_rules! guarded {
    ($lib:ty, $name:expr, -> $ret:ty $body:block) => {
        $crate::boundary::run::<$lib, $ret>(
            $name,
            || -> <$ret as $crate::boundary::CReturn<$lib>>::Body { $body },
        )
    };
    ($lib:ty, $name:expr, $body:block) => {
        $crate::guarded!($lib, $name, -> () $body)
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::ffi::c_char;

    thread_local! {
        static SEEN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    /// A library whose hooks record what they were given; `enter` refuses `"refused"`.
    struct Test;
    impl Library for Test {
        type Error = crate::Errno;
        fn panicked(function: &str, message: &str) {
            SEEN.with(|s| s.borrow_mut().push(format!("{function}: {message}")));
        }
        fn errno(function: &str, e: crate::Errno) -> c_int {
            SEEN.with(|s| s.borrow_mut().push(format!("{function} failed: {}", e.0)));
            e.0
        }
        fn enter(function: &str) -> crate::Result<()> {
            if function == "refused" { Err(crate::Errno::EPERM) } else { Ok(()) }
        }
    }

    fn fallback() -> *const c_char {
        SEEN.with(|s| s.borrow_mut().push("fallback made".to_owned()));
        c"fallback".as_ptr()
    }

    fn seen() -> Vec<String> {
        SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }

    crate::export! {
        library = Test;
        safety = "Test exports take no pointers they dereference.";

        /// Panics when asked to.
        pub fn test_boundary_int(fail: c_int) -> c_int {
            match fail {
                0 => Ok(()),
                1 => Err(crate::Errno::ENOENT),
                _ => panic!("int {fail}"),
            }
        }
        /// Panics when asked to.
        pub unsafe fn test_boundary_mut(fail: c_int) -> *mut u8 {
            if fail != 0 {
                panic!("mut");
            }
            8 as *mut u8
        }
        /// Panics when asked to.
        pub fn test_boundary_const(fail: c_int) -> *const c_char {
            if fail != 0 {
                panic!("const");
            }
            c"ok".as_ptr()
        }
        /// Panics when asked to.
        pub fn test_boundary_unit(fail: c_int) {
            if fail != 0 {
                panic!("unit");
            }
        }
        /// Panics when asked to; returns a string of its own then, made after the report.
        on_panic(fallback()) pub fn test_boundary_own(fail: c_int) -> *const c_char {
            if fail != 0 {
                panic!("own");
            }
            c"ok".as_ptr()
        }
        /// Never guarded.
        unguarded pub fn test_boundary_unguarded(x: c_int) -> c_int {
            x + 1
        }
    }

    #[test]
    fn the_fallback_follows_the_return_type() {
        assert_eq!(<c_int as CReturn<Test>>::on_panic(), libc::EIO);
        assert!(<*mut u64 as CReturn<Test>>::on_panic().is_null());
        assert!(<*const c_char as CReturn<Test>>::on_panic().is_null());
        <() as CReturn<Test>>::on_panic();
    }

    #[test]
    fn a_panicking_export_returns_its_types_fallback_and_reports_it() {
        seen();
        assert_eq!(test_boundary_int(2), libc::EIO);
        // SAFETY: dereferences nothing.
        assert!(unsafe { test_boundary_mut(1) }.is_null());
        assert!(test_boundary_const(1).is_null());
        test_boundary_unit(1);
        assert_eq!(
            seen(),
            [
                "test_boundary_int: int 2",
                "test_boundary_mut: mut",
                "test_boundary_const: const",
                "test_boundary_unit: unit"
            ]
        );
    }

    #[test]
    fn an_own_fallback_replaces_the_types() {
        seen();
        // SAFETY: both are static NUL-terminated strings.
        let s = |p| unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap();
        assert_eq!(s(test_boundary_own(0)), "ok");
        assert_eq!(s(test_boundary_own(1)), "fallback");
        assert_eq!(seen(), ["test_boundary_own: own", "fallback made"]);
    }

    #[test]
    fn values_pass_through_and_errors_convert() {
        seen();
        assert_eq!(test_boundary_int(0), 0);
        assert_eq!(test_boundary_int(1), libc::ENOENT);
        // SAFETY: dereferences nothing.
        assert_eq!(unsafe { test_boundary_mut(0) } as usize, 8);
        assert!(!test_boundary_const(0).is_null());
        test_boundary_unit(0);
        assert_eq!(test_boundary_unguarded(41), 42);
        assert_eq!(seen(), [format!("test_boundary_int failed: {}", libc::ENOENT)]);
    }

    #[test]
    fn enter_runs_before_an_int_body() {
        seen();
        let r = crate::guarded!(Test, "refused", -> c_int { unreachable!("the body must not run") });
        assert_eq!(r, libc::EPERM);
        assert_eq!(seen(), [format!("refused failed: {}", libc::EPERM)]);
        let mut ran = false;
        crate::guarded!(Test, "refused", {
            ran = true;
        });
        assert!(ran, "enter applies to int bodies only");
    }

    #[test]
    fn guard_passes_values_and_reports_panics() {
        let mut msg = String::new();
        assert_eq!(guard(-1, |m| msg = m.to_owned(), || -> i32 { panic!("boom {}", 7) }), -1);
        assert_eq!(msg, "boom 7");
        assert_eq!(guard(-1, |_| unreachable!(), || 42), 42);
    }
}
