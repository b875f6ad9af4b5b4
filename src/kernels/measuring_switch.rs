//! Measuring switches: environment variables that force one of vramfit's code paths where it
//! otherwise picks one by device (`VRAMFIT_POINTWISE`, `VRAMFIT_GROUP_NORM_GELU`,
//! `VRAMFIT_GROUP_NORM_GELU_WORKGROUP`, `VRAMFIT_DEPTHWISE`, `VRAMFIT_FUSED_INFERENCE`), so that
//! both paths can be timed from one binary.

use std::collections::HashSet;
use std::sync::Mutex;

/// The value of the switch `name` as `parse` reads it: `None` when the variable is unset, or
/// when `parse` refuses its value, which is then ignored with a warning (once per switch per
/// process) naming `choices`, the values it takes.
pub fn measuring_switch<T>(
    name: &'static str,
    choices: impl std::fmt::Display,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Option<T> {
    static WARNED: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let value = std::env::var(name).ok()?;
    let parsed = parse(&value);
    if parsed.is_none() {
        // A poisoned lock only loses a warning.
        if let Ok(mut warned) = WARNED.lock()
            && warned.get_or_insert_default().insert(name)
        {
            tracing::warn!("{name}={value:?} ignored: use {choices} (or unset it)");
        }
    }
    parsed
}

/// A two-way switch `name`: `false` when it is set to `off` (the path it turns off), `true` when
/// it is set to `on` or unset; any other value is ignored with a warning (as
/// [`measuring_switch`]'s, naming `off` and `on`) and reads as `true`.
pub fn unless_off(name: &'static str, off: &str, on: &str) -> bool {
    let value = measuring_switch(name, format_args!("{off} or {on}"), |v| [off, on].contains(&v).then_some(v == on));
    value.unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::{measuring_switch, unless_off};

    #[test]
    fn an_unset_switch_and_a_refused_value_read_as_none() {
        let unset = measuring_switch("VRAMFIT_MEASURING_SWITCH_TEST_UNSET", "a or b", |_| Some(1));
        assert_eq!(unset, None);
        // PATH is set in every test environment; a parser refusing it reads as None.
        assert_eq!(measuring_switch("PATH", "nothing", |_| None::<u32>), None);
        assert_eq!(
            measuring_switch("PATH", "anything", |v| Some(v.len())),
            std::env::var("PATH").ok().map(|v| v.len())
        );
    }

    #[test]
    fn a_two_way_switch_is_on_unless_set_to_off() {
        assert!(unless_off("VRAMFIT_MEASURING_SWITCH_TEST_UNSET", "off", "on"));
        // PATH is set in every test environment, to neither value: ignored, so on.
        assert!(unless_off("PATH", "off", "on"));
        let path = std::env::var("PATH").expect("PATH is set");
        assert!(!unless_off("PATH", &path, "on"));
        assert!(unless_off("PATH", "off", &path));
    }
}
