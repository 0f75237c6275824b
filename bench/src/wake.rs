//! Keeping idle cores awake while the figures run.
//!
//! A core with nothing to run enters an idle state; a packet or a wake-up for it
//! then waits for the core to leave that state. In a virtual machine the deep state is
//! a halt that exits to the host, and the way back costs tens of microseconds (on the
//! 2-core machine of the README's runs, whose host turns the guest's halt-polling off,
//! a connection's p50 straight to a pod went from 77 to 51 µs with the cores kept
//! polling). How much of that a connection meets depends on whether the machine
//! happens to be busy, so it moves every latency figure with whatever else runs: a
//! floor measured while the control plane was still busy came out 8 µs below the same
//! floor measured later on an idle machine.
//!
//! The bench holds a PM QoS request of 0 µs on `/dev/cpu_dma_latency` for the run (as
//! latency tools such as cyclictest do): the cpuidle governor then keeps idle cores in
//! the polling state. The kernel drops the request when the file is closed, by the
//! bench or by its exit, however it ends, so nothing outlives the run. Polling is still
//! the idle task, so `/proc/stat` counts it as idle and the CPU figures are unchanged
//! in kind. `--idle-states` leaves the machine's idle states alone.

use std::io::Write as _;

/// The PM QoS device of the CPU wake-up latency.
const DEVICE: &str = "/dev/cpu_dma_latency";

/// The hold on the cores' idle states, dropped with the value.
pub struct AwakeCores {
    /// The open request, or `None` when none is held.
    file: Option<std::fs::File>,
    /// What the report says about the run's idle states.
    pub description: String,
}

impl AwakeCores {
    /// Holds a wake-up latency of 0 µs on every core until dropped. A machine without
    /// the device, or which refuses the request, is measured as it is, and the
    /// description says so and why.
    pub fn hold() -> Self {
        let states = idle_states();
        match request_zero() {
            Ok(file) => Self {
                file: Some(file),
                description: format!(
                    "idle cores kept polling for the run ({DEVICE} held at 0 µs; \
                     {states})"
                ),
            },
            Err(e) => Self {
                file: None,
                description: format!(
                    "idle cores left to their idle states ({DEVICE} could not be held at \
                     0 µs: {e}; {states})"
                ),
            },
        }
    }

    /// Holds nothing: the machine's idle states as they are (`--idle-states`).
    pub fn left_alone() -> Self {
        Self {
            file: None,
            description: format!(
                "idle cores left to their idle states (--idle-states; {})",
                idle_states()
            ),
        }
    }

    /// Whether the request is held.
    pub fn held(&self) -> bool {
        self.file.is_some()
    }
}

/// Opens the device and writes the request: a native-endian 32-bit count of
/// microseconds (Documentation/power/pm_qos_interface.rst).
fn request_zero() -> std::io::Result<std::fs::File> {
    let mut f = std::fs::OpenOptions::new().write(true).open(DEVICE)?;
    f.write_all(&0i32.to_ne_bytes())?;
    Ok(f)
}

/// The cpuidle driver and cpu0's states with their exit latencies, as sysfs gives
/// them, for the report ("no cpuidle driver" where there is none).
fn idle_states() -> String {
    let base = std::path::Path::new("/sys/devices/system/cpu");
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let Some(driver) = read(base.join("cpuidle/current_driver")).filter(|d| d != "none") else {
        return "no cpuidle driver".into();
    };
    let mut states = Vec::new();
    for i in 0.. {
        let dir = base.join(format!("cpu0/cpuidle/state{i}"));
        let (Some(name), Some(latency)) = (read(dir.join("name")), read(dir.join("latency")))
        else {
            break;
        };
        states.push(format!("{name} {latency} µs"));
    }
    format!(
        "cpuidle driver {driver}, states of cpu0 with their exit latency: {}",
        states.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request in force now, in microseconds (what reading the device gives).
    fn in_force() -> std::io::Result<i32> {
        use std::io::Read as _;
        let mut b = [0u8; 4];
        std::fs::File::open(DEVICE)?.read_exact(&mut b)?;
        Ok(i32::from_ne_bytes(b))
    }

    #[test]
    fn the_description_names_the_driver_or_its_absence() {
        let s = idle_states();
        assert!(
            s == "no cpuidle driver" || s.starts_with("cpuidle driver "),
            "{s}"
        );
    }

    #[test]
    fn a_hold_is_in_force_until_dropped() {
        let Ok(before) = in_force() else {
            eprintln!("skipped: {DEVICE} cannot be read here (needs root)");
            return;
        };
        let a = AwakeCores::hold();
        assert!(a.held(), "{}", a.description);
        assert_eq!(in_force().unwrap(), 0, "{}", a.description);
        drop(a);
        assert_eq!(in_force().unwrap(), before);
    }

    #[test]
    fn left_alone_holds_nothing_and_says_why() {
        let a = AwakeCores::left_alone();
        assert!(!a.held());
        assert!(a.description.contains("--idle-states"), "{}", a.description);
    }
}
