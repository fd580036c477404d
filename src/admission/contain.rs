//! A panic while deciding one admission review fails that review (the
//! webhook answers 500 and keeps serving); a panic anywhere else stops the
//! process, as the release profile's old `panic = "abort"` did, so that no
//! command goes on half-working (a `serve` whose writer died, say) and the
//! kubelet restarts it.
//!
//! Containment needs unwinding: the release profile says `panic = "unwind"`,
//! and [`install_panic_policy`] turns every panic outside [`contain`] back
//! into an abort.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};

thread_local! {
    /// Whether this thread is inside [`contain`].
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
}

/// Install the process's panic hook (from `main`, before anything runs): a
/// contained panic is logged and unwinds to its [`contain`]; any other is
/// reported as usual and aborts the process.
pub fn install_panic_policy() {
    let report = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if CONTAINED.with(Cell::get) {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            tracing::error!("contained a panic{at}: {}", message(info.payload()));
            return;
        }
        report(info);
        std::process::abort();
    }));
}

/// Run `work`; a panic in it becomes `Err` with the panic's message. `work`
/// must leave nothing shared half-changed when it unwinds (a pure function
/// of its input, like deciding a review).
pub fn contain<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CONTAINED.with(|c| c.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(work));
    CONTAINED.with(|c| c.set(outer));
    result.map_err(|payload| message(payload.as_ref()))
}

fn message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (None, Some(s)) => s.clone(),
        (None, None) => "a panic without a message".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_an_error_with_its_message_and_the_thread_goes_on() {
        assert_eq!(contain(|| 7), Ok(7));
        let err = contain(|| -> u8 { panic!("bad review {}", 3) }).unwrap_err();
        assert_eq!(err, "bad review 3");
        let err = contain(|| -> u8 { std::panic::panic_any(5u32) }).unwrap_err();
        assert_eq!(err, "a panic without a message");
        // Nested: the inner one ends, the outer one still contains.
        let outer = contain(|| {
            let inner = contain(|| -> u8 { panic!("inner") });
            assert_eq!(inner.unwrap_err(), "inner");
            panic!("outer")
        });
        assert_eq!(outer.unwrap_err(), "outer");
        assert!(!CONTAINED.with(Cell::get), "the flag is cleared on the way out");
    }

    #[test]
    fn the_shipped_profiles_unwind_or_nothing_could_be_contained() {
        // The tests' debug binary unwinds whatever Cargo.toml says; the
        // release and image profiles (which inherits release) must too.
        let manifest = include_str!("../../Cargo.toml");
        let release = manifest.split("[profile.release]").nth(1).expect("a release profile");
        let release = release.split("\n[").next().unwrap_or_default();
        assert!(release.contains("panic = \"unwind\""), "{release}");
        assert!(!manifest.contains("panic = \"abort\""), "a profile aborts on panic");
    }
}
