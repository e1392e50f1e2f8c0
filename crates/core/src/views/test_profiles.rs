//! Profiles the views' unit tests share: the pprof messages of a small program, and its
//! resolved form.
use super::reader::{Budget, ReadLimits, StackProfile};
use crate::pprof::{
    PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofProfile, PprofSample, PprofValueType,
};

/// A profile of value types cpu-time and wall-time with functions main (1), work (2),
/// spin (3), sleep (4), each location i having function i, and the given samples
/// `(location ids leaf first, [cpu, wall], thread name)`.
pub(crate) fn profile(samples: &[(&[u64], [i64; 2], &str)]) -> PprofProfile {
    let mut strings: Vec<String> =
        ["", "cpu-time", "nanoseconds", "wall-time", "main", "work", "spin", "sleep", "a.rb"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    strings.push("thread name".to_string()); // 9
    let mut intern = |s: &str| -> i64 {
        if let Some(i) = strings.iter().position(|x| x == s) {
            return i as i64;
        }
        strings.push(s.to_string());
        strings.len() as i64 - 1
    };
    let sample = samples
        .iter()
        .map(|(locations, values, thread)| PprofSample {
            location_id: locations.to_vec(),
            value: values.to_vec(),
            label: vec![PprofLabel { key: 9, str: intern(thread), num: 0, num_unit: 0 }],
        })
        .collect();
    PprofProfile {
        sample_type: vec![
            PprofValueType { r#type: 1, unit: 2 },
            PprofValueType { r#type: 3, unit: 2 },
        ],
        sample,
        function: (1..=4)
            .map(|id| PprofFunction {
                id,
                name: 3 + id as i64,
                system_name: 3 + id as i64,
                filename: 8,
                start_line: 0,
            })
            .collect(),
        location: (1..=4)
            .map(|id| PprofLocation {
                id,
                mapping_id: 0,
                address: 0,
                line: vec![PprofLine { function_id: id, line: 10 }],
                is_folded: false,
            })
            .collect(),
        string_table: strings,
        time_nanos: 1_000,
        duration_nanos: 5_000,
        ..Default::default()
    }
}

/// `p` resolved under the default limits.
pub(crate) fn resolve(p: PprofProfile) -> StackProfile {
    let budget = Budget::new(&ReadLimits::default(), 1);
    StackProfile::resolve(p, budget, Budget::output(&ReadLimits::default(), 0)).unwrap()
}

/// Four samples: spin under work under main (two threads), work under main, sleep (wall-time
/// only).
pub(crate) fn example() -> StackProfile {
    resolve(profile(&[
        (&[3, 2, 1], [700, 800], "worker"),
        (&[2, 1], [100, 100], "worker"),
        (&[3, 2, 1], [50, 60], "other"),
        (&[4, 1], [0, 900], "sleeper"),
    ]))
}
