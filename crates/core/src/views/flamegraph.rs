//! A flamegraph as an SVG document, drawn by inferno (the Rust port of `flamegraph.pl`) from
//! the folded stacks.
use super::reader::StackProfile;
use super::{FoldOptions, ViewError};

/// What inferno writes per frame it draws beyond the frame's name (at most twice: title and
/// text): the `<g>`, `<title>`, `<rect>` and `<text>` elements. Measured at 143 to 218 bytes
/// per drawn frame with the names (7 to 30 bytes) on the profiler's pprofs; rounded up.
const SVG_BYTES_PER_FRAME: usize = 256;

/// Most bytes the SVG of `folded` can take: each drawn frame is a frame of some folded line,
/// and inferno draws none narrower than `min_width` percent of the whole, so at most
/// `100 / min_width` per depth level.
fn svg_bound(folded: &str, min_width: f64) -> usize {
    let (mut frames, mut depth) = (0usize, 0usize);
    for line in folded.lines() {
        let line_frames = line.bytes().filter(|&b| b == b';').count() + 1;
        frames += line_frames;
        depth = depth.max(line_frames);
    }
    let per_level = if min_width > 0.0 { (100.0 / min_width).ceil() as usize } else { frames };
    frames
        .min(per_level.saturating_mul(depth))
        .saturating_mul(SVG_BYTES_PER_FRAME)
        .saturating_add(folded.len().saturating_mul(2))
}

/// The sum inferno adds up of `folded`'s values: the positive ones (it skips a line whose count
/// does not parse as a `usize`), or `None` past `usize::MAX`, where its `usize` time overflows
/// (a panic in a debug build, a wrapped, wrong layout in a release one). Found by the
/// `pprof_reader` fuzz target: three samples of `i64::MAX`.
fn drawn_total(folded: &str) -> Option<usize> {
    folded
        .lines()
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<usize>().ok())
        .try_fold(0usize, usize::checked_add)
}

impl StackProfile {
    /// An SVG flamegraph of value `value`, drawn by inferno from [`StackProfile::folded`].
    /// Nanosecond values are shown in milliseconds.
    ///
    /// Fails with [`ViewError::NothingToDraw`] if no sample has some of the value
    /// ([`ViewError::NoMatch`] if [`Self::keep_labels`] left no sample), as [`Self::folded`]
    /// does, and with [`ViewError::OutputTooLarge`] if the folded text, or the SVG at its
    /// largest ([`svg_bound`]), could take more than the profile's output bound. A name longer
    /// than [`super::MAX_DRAWN_NAME_CHARS`] is cut (`…`).
    pub fn flamegraph(
        &self,
        value: usize,
        title: Option<&str>,
        options: &FoldOptions,
    ) -> Result<String, ViewError> {
        let (value_name, unit) = &self.value_types[value];
        let options = FoldOptions { cut_names: true, ..options.clone() };
        let folded = self.folded(value, &options)?;
        if folded.is_empty() {
            return Err(self.nothing_left(ViewError::NothingToDraw(value_name.clone())));
        }
        if drawn_total(&folded).is_none() {
            return Err(ViewError::Render(format!(
                "the {value_name} values add up to more than {}, which inferno cannot lay out",
                usize::MAX
            )));
        }
        let mut opts = inferno::flamegraph::Options::default();
        self.output_budget.check_usize(svg_bound(&folded, opts.min_width), "the flamegraph")?;
        opts.title = title.map_or_else(|| format!("{value_name} flamegraph"), str::to_string);
        (opts.count_name, opts.factor) = match unit.as_str() {
            // inferno rounds the shown value to an integer: milliseconds read best and lose
            // only frames too narrow to read anyway.
            "nanoseconds" => (format!("ms of {value_name}"), 1e-6),
            "count" => (value_name.clone(), 1.0),
            unit => (format!("{unit} of {value_name}"), 1.0),
        };
        // Same colour for the same function across runs and pictures.
        opts.hash = true;
        let mut svg = Vec::with_capacity(folded.len() * 4 + 32 * 1024);
        inferno::flamegraph::from_lines(&mut opts, folded.lines(), &mut svg)
            .map_err(|e| ViewError::Render(e.to_string()))?;
        String::from_utf8(svg).map_err(|e| ViewError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_profiles::{example, profile, resolve};
    use super::*;

    #[test]
    fn flamegraph_is_an_svg_naming_the_functions() {
        let p = example();
        let svg = p.flamegraph(0, Some("cpu"), &FoldOptions::default()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80]);
        assert!(svg.contains("<svg"));
        assert!(svg.contains("spin"));
        assert!(svg.contains("ms of cpu-time"));
        assert!(!svg.contains("sleep ("), "sleep has no cpu-time");
        let wall = p.flamegraph(1, None, &FoldOptions::default()).unwrap();
        assert!(wall.contains("sleep"));
        assert!(wall.contains("wall-time flamegraph"));
    }

    #[test]
    fn the_svg_bound_counts_frames_up_to_what_inferno_can_draw_per_level() {
        let folded = "a;b;c 1\na;b 2\nd 3\n";
        assert_eq!(svg_bound(folded, 0.01), 6 * SVG_BYTES_PER_FRAME + 2 * folded.len());
        // At most 2 frames per level at min_width 50%: 2 x depth 3.
        let wide = "a;b;c 1\nd;e;f 1\ng;h;i 1\n";
        assert_eq!(svg_bound(wide, 50.0), 6 * SVG_BYTES_PER_FRAME + 2 * wide.len());
    }

    #[test]
    fn refuses_a_flamegraph_that_could_outgrow_the_budget() {
        // 65,536 one-letter frames: 131 kB of folded text, up to 16 MiB of SVG.
        let mut p = profile(&[]);
        p.string_table[4] = "a".to_string();
        p.sample.push(crate::pprof::PprofSample {
            location_id: vec![1; 65_536],
            value: vec![1, 1],
            label: vec![],
        });
        let bytes = prost::Message::encode_to_vec(&p);
        let limits = crate::views::ReadLimits::new(1 << 20).with_max_output(Some(8 << 20));
        let p = StackProfile::from_bytes(&bytes, &limits).unwrap();
        assert_eq!(p.folded(0, &FoldOptions::default()).unwrap().len(), 2 * 65_536 + 2);
        let e = p.flamegraph(0, None, &FoldOptions::default()).unwrap_err();
        assert!(matches!(e, ViewError::OutputTooLarge { what: "the flamegraph", .. }), "{e}");
    }

    #[test]
    fn long_names_are_cut() {
        // A 256 KiB name 400 frames deep: the SVG was 105 MB; cut, it is a few MB.
        let mut p = profile(&[]);
        p.string_table[4] = "m".repeat(256 << 10);
        p.sample.push(crate::pprof::PprofSample {
            location_id: vec![1; 400],
            value: vec![1, 1],
            label: vec![],
        });
        let bytes = prost::Message::encode_to_vec(&p);
        let p = StackProfile::from_bytes(&bytes, &crate::views::ReadLimits::default()).unwrap();
        let svg = p.flamegraph(0, None, &FoldOptions::default()).unwrap();
        let cut = format!("{}…", "m".repeat(crate::views::MAX_DRAWN_NAME_CHARS - 1));
        assert!(svg.contains(&cut));
        assert!(!svg.contains(&"m".repeat(crate::views::MAX_DRAWN_NAME_CHARS)));
        assert!(
            svg.len()
                < 2 * 400 * (crate::views::MAX_DRAWN_NAME_CHARS + SVG_BYTES_PER_FRAME) + 65_536
        );
    }

    #[test]
    fn values_adding_up_past_usize_are_an_error_not_a_panic() {
        let max = [i64::MAX, i64::MAX];
        let p = resolve(profile(&[(&[1], max, "t"), (&[2, 1], max, "t"), (&[3, 1], max, "t")]));
        let e = p.flamegraph(0, None, &FoldOptions::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "could not render the flamegraph: the cpu-time values add up to more than \
             18446744073709551615, which inferno cannot lay out"
        );
        // Two of them fit: drawn.
        let p = resolve(profile(&[(&[1], max, "t"), (&[2, 1], max, "t"), (&[3, 1], [-5, 0], "t")]));
        assert!(p.flamegraph(0, None, &FoldOptions::default()).is_ok());
    }

    #[test]
    fn flamegraph_of_nothing_is_an_error() {
        let p = resolve(profile(&[(&[4, 1], [0, 900], "t")]));
        let e = p.flamegraph(0, None, &FoldOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "nothing to draw: no sample has a non-zero cpu-time");
    }
}
