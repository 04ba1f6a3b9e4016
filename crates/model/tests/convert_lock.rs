//! Concurrent converts into one destination (issue 17, item 5): one writes the install, the
//! other is refused by name; never a success over a mixed install.

use spindle_model::install::{self, lock::DestinationLock, InstallError, Verify};
use spindle_model::quant::WeightFormat;
use spindle_testkit::fixture;

#[test]
fn a_held_destination_lock_refuses_a_second_convert() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("install");
    let lock = DestinationLock::acquire(&dst, "install").unwrap();
    let err = install::convert(&fixture("qwen3_5_moe"), &dst, WeightFormat::Q8, &mut |_| {
        true
    })
    .unwrap_err();
    assert!(matches!(err, InstallError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("another convert"), "{err}");
    assert!(!dst.exists());
    drop(lock);
    install::convert(&fixture("qwen3_5_moe"), &dst, WeightFormat::Q8, &mut |_| {
        true
    })
    .unwrap();
    // The lock file goes with the convert.
    assert!(!tmp.path().join("install.lock").exists());
}

#[test]
fn concurrent_converts_into_one_destination_leave_one_whole_install() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("install");
    // Different sources and formats, so a mix of the two would fail verification.
    let jobs = [
        ("qwen3_5_moe", WeightFormat::Q8),
        ("qwen3_5_moe_fused", WeightFormat::Q4),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&(name, quant)| {
                let dst = dst.clone();
                s.spawn(move || {
                    install::convert(&fixture(name), &dst, quant, &mut |_| {
                        // Widen the window in which the two overlap.
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        true
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, InstallError::Locked { .. } | InstallError::Exists { .. }),
                "{e}"
            );
        }
    }
    install::Install::open(&dst, Verify::Full).unwrap();
}
