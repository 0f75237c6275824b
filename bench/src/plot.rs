//! PNG plots of the figures, drawn with plotters. Text needs a TrueType font: the
//! first one found in the system's font directories is used; without one the plots
//! are skipped and the report says so.

use std::path::{Path, PathBuf};

use plotters::{
    coord::{combinators::IntoLogRange, Shift},
    prelude::*,
    style::FontStyle,
};

use super::{
    node::{Loader, Proxy},
    Report,
};

/// Directories searched for a `.ttf` font, in order.
const FONT_DIRS: &[&str] = &["/usr/share/fonts", "/usr/local/share/fonts"];
/// Preferred font files.
const FONT_NAMES: &[&str] = &["DejaVuSans.ttf", "LiberationSans-Regular.ttf"];

fn find_font() -> Option<PathBuf> {
    fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && depth > 0 {
                walk(&p, depth - 1, found);
            } else if p.extension().is_some_and(|x| x == "ttf") {
                found.push(p);
            }
        }
    }
    let mut found = Vec::new();
    for d in FONT_DIRS {
        walk(Path::new(d), 4, &mut found);
    }
    found.sort();
    FONT_NAMES
        .iter()
        .find_map(|name| found.iter().find(|p| p.ends_with(name)).cloned())
        .or_else(|| found.into_iter().next())
}

fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let path = find_font().ok_or("no TrueType font found for the plots' text")?;
        let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "the font could not be read".to_string())
    })
    .clone()
}

/// A series: its name and (x, y) points.
type Series = (String, Vec<(f64, f64)>);

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Draws the mesh, one line with its points per series, and the legend, on a chart
/// whose y axis is linear or logarithmic.
fn lines<'a, Y>(
    mut c: ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<plotters::coord::combinators::LogCoord<f64>, Y>,
    >,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<_>| format!("{e:?}");
    c.configure_mesh()
        .x_desc(x_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        // Points marked where they are few (a CDF is a line of hundreds).
        if pts.len() <= 20 {
            c.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// A line chart with a logarithmic x axis (Services, or `x_label`) and a linear or
/// log y axis.
fn chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    log_y: bool,
    series: &[Series],
) -> Result<(), String> {
    let points: Vec<(f64, f64)> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    if points.is_empty() {
        return Err("no data".into());
    }
    let (xmin, xmax) = points
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = points
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| format!("{e:?}");
    root.fill(&WHITE).map_err(err)?;
    let x_range = (xmin.max(1.0) / 1.5..xmax * 1.5).log_scale();
    let draw = |root: &DrawingArea<BitMapBackend, Shift>| -> Result<(), String> {
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80);
        if log_y {
            let c = builder
                .build_cartesian_2d(
                    x_range.clone(),
                    (ymin.max(1e-3) / 2.0..ymax * 2.0).log_scale(),
                )
                .map_err(err)?;
            lines(c, x_label, y_label, series)?;
        } else {
            let c = builder
                .build_cartesian_2d(x_range.clone(), 0.0..ymax * 1.15)
                .map_err(err)?;
            lines(c, x_label, y_label, series)?;
        }
        Ok(())
    };
    draw(&root)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Draws every figure that has data; returns (file name, title) of each PNG written,
/// and a line per plot that could not be drawn.
pub fn draw_all(r: &Report, out: &Path) -> Vec<(String, String)> {
    let mut written = Vec::new();
    if let Err(e) = register_font() {
        eprintln!("bench: plots skipped: {e}");
        return written;
    }
    // File, title, y label, log y, series; the x axis is Services.
    let mut plots: Vec<(&str, String, &str, bool, Vec<Series>)> = Vec::new();
    if let Some(f) = r.fig1.ok() {
        let s = |name: &str, get: fn(&super::kernel_cost::Fig1Row) -> f64| {
            (
                name.to_string(),
                f.rows.iter().map(|x| (x.services as f64, get(x))).collect(),
            )
        };
        plots.push((
            "fig1-per-packet.png",
            "1. Kernel cost per packet (TC, BPF_PROG_TEST_RUN, median)".into(),
            "ns per packet",
            false,
            vec![
                s("no match (floor)", |x| x.no_match_ns.median),
                s("new flow", |x| x.new_flow_ns.median),
                s("established", |x| x.established_ns.median),
                s("IPv6 no match", |x| x.ipv6_no_match_ns.median),
                s("IPv6 new flow", |x| x.ipv6_new_flow_ns.median),
                s("IPv6 established", |x| x.ipv6_established_ns.median),
            ],
        ));
    }
    if let Some(f) = r.fig2.ok() {
        let mut series = Vec::new();
        for p in [
            Proxy::Sliceway,
            Proxy::Iptables,
            Proxy::Nftables,
            Proxy::Floor,
        ] {
            for (q, get) in [
                (
                    "p50",
                    (|x: &super::node::Fig2Row| x.p50_us.median) as fn(&_) -> f64,
                ),
                ("p99", |x: &super::node::Fig2Row| x.p99_us.median),
            ] {
                series.push((
                    format!("{} {q}", p.name()),
                    f.rows
                        .iter()
                        .filter(|x| x.proxy == p)
                        .map(|x| (x.services as f64, get(x)))
                        .collect(),
                ));
            }
        }
        plots.push((
            "fig2-connection-latency.png",
            "2. New-connection latency through the node (median of rounds)".into(),
            "µs",
            true,
            series,
        ));
    }
    if let Some(f) = r.fig3.ok() {
        let mut series = vec![(
            "sliceway full sync".to_string(),
            f.sliceway
                .iter()
                .map(|(n, s)| (*n as f64, s.full_ms.median))
                .collect(),
        )];
        for l in [
            Loader::IptablesRestore,
            Loader::IptablesLegacyRestore,
            Loader::Nft,
        ] {
            series.push((
                l.name().to_string(),
                f.baselines
                    .iter()
                    .filter(|b| b.loader == l)
                    .map(|b| (b.services as f64, b.ms.median))
                    .collect(),
            ));
        }
        plots.push((
            "fig3-programming-time.png",
            "3. Programming time from nothing (median)".into(),
            "ms",
            true,
            series,
        ));
    }
    if let Some(f) = r.fig4.ok() {
        plots.push((
            "fig4-agent-memory.png",
            "4. Agent peak RSS (median)".into(),
            "MiB",
            false,
            vec![(
                "sliceway-agent VmHWM".into(),
                f.rows
                    .iter()
                    .map(|x| (x.services as f64, x.peak_rss_mib.median))
                    .collect(),
            )],
        ));
    }
    let mut plots: Vec<_> = plots
        .into_iter()
        .map(|(file, title, y, log_y, series)| (file, title, "Services", y, log_y, series))
        .collect();
    if let Some(f) = r.fig7.ok() {
        // The CDF of each side's samples, at most 200 points a side.
        let series = f
            .rows
            .iter()
            .filter(|row| !row.sorted_us.is_empty())
            .map(|row| {
                let v = &row.sorted_us;
                let step = v.len().div_ceil(200);
                let mut pts: Vec<(f64, f64)> = (0..v.len())
                    .step_by(step)
                    .map(|i| (v[i], (i + 1) as f64 / v.len() as f64))
                    .collect();
                pts.push((v[v.len() - 1], 1.0));
                (row.side.name().to_string(), pts)
            })
            .collect();
        plots.push((
            "fig7-latency-cdf.png",
            format!(
                "7. New-connection latency CDF, real proxies, {} Services",
                f.rows.first().map_or(0, |row| row.services)
            ),
            "µs (log)",
            "fraction of connections",
            false,
            series,
        ));
    }
    for (file, title, x, y, log_y, series) in plots {
        match chart(&out.join(file), &title, x, y, log_y, &series) {
            Ok(()) => written.push((file.to_string(), title)),
            Err(e) => eprintln!("bench: plot {file} not drawn: {e}"),
        }
    }
    written
}
