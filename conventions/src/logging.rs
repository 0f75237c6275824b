//! Logging as Kubernetes components log, for both binaries: `--logging-format text|json`
//! and `-v`/`--v LEVEL` ([`LogArgs`]), on stderr, in colour only on a terminal.
//!
//! Upstream's flags are in component-base's
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/component-base/logs/api/v1/options.go>
//! (`logging-format`, `v`), its JSON lines in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/component-base/logs/json/json.go>
//! (`ts` in seconds since the epoch, `caller`, `msg`, `v`, then the key/value pairs).
//! Verbosity maps onto tracing's levels ([`level_for`]); without `-v` the `RUST_LOG`
//! directives apply, else `info`.

use std::io::IsTerminal as _;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    filter::LevelFilter,
    fmt::{
        format::{JsonFields, Writer},
        FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter,
    },
    registry::LookupSpan,
    EnvFilter, Layer,
};

/// The flags, global to every subcommand.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// Log format, as Kubernetes components' flag: `text`, or `json` (one object per
    /// line: `ts`, `caller`, `msg`, `v` or `level`, then the fields).
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    pub logging_format: Format,
    /// Log verbosity, as Kubernetes components' `-v`: 0 to 2 log info and above, 3
    /// and 4 debug, 5 and more trace. Without it, the RUST_LOG directives, else info.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", global = true)]
    pub v: Option<u8>,
}

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// The tracing level a klog verbosity stands for: 0 to 2 are what kube components
/// log by default and in steady state (info), 3 and 4 debugging (debug), 5 and up
/// tracing (trace).
pub fn level_for(v: u8) -> Level {
    match v {
        0..=2 => Level::INFO,
        3..=4 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// The klog verbosity a tracing level is logged at (the `v` of a JSON line); `None`
/// for warnings and errors, which klog logs without one.
fn verbosity(level: Level) -> Option<u8> {
    match level {
        Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(5),
        _ => None,
    }
}

impl LogArgs {
    /// What is logged: every target at `-v`'s level when given; else `RUST_LOG`'s
    /// directives, else info.
    pub fn filter(&self) -> EnvFilter {
        match self.v {
            Some(v) => EnvFilter::default().add_directive(LevelFilter::from(level_for(v)).into()),
            None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        }
    }

    /// The formatting layer, on stderr; colour only when stderr is a terminal and
    /// `NO_COLOR` is not set.
    pub fn layer<S>(&self) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        self.layer_to(std::io::stderr, colour)
    }

    /// [`LogArgs::layer`] writing to `writer`, in colour when `colour` (text only).
    pub fn layer_to<S, W>(&self, writer: W, colour: bool) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    {
        let layer = tracing_subscriber::fmt::layer().with_writer(writer);
        match self.logging_format {
            Format::Text => layer.with_ansi(colour).boxed(),
            Format::Json => layer
                .with_ansi(false)
                .fmt_fields(JsonFields::new())
                .event_format(KubeJson)
                .boxed(),
        }
    }
}

/// One JSON object per line, with component-base's keys: `ts` (seconds since the
/// epoch), `caller` (file:line), `msg`, `v` (info and below; `level` otherwise), then
/// the event's fields and those of the spans it is in.
struct KubeJson;

impl<S, N> FormatEvent<S, N> for KubeJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        use serde_json::{Map, Value};
        let meta = event.metadata();
        // component-base's keys first, in its order; then the spans' fields (outermost
        // first, so the innermost wins) and the event's.
        let mut head: Vec<(&str, Value)> = Vec::with_capacity(4);
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        head.push(("ts", ts.into()));
        if let (Some(file), Some(number)) = (meta.file(), meta.line()) {
            head.push(("caller", format!("{file}:{number}").into()));
        }
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        head.push((
            "msg",
            fields.0.remove("message").unwrap_or_else(|| "".into()),
        ));
        match verbosity(*meta.level()) {
            Some(v) => head.push(("v", v.into())),
            None => head.push(("level", meta.level().as_str().to_lowercase().into())),
        }
        let mut rest = Map::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let Some(formatted) = ext.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(span_fields)) = serde_json::from_str(formatted) {
                    rest.extend(span_fields);
                }
            }
        }
        rest.extend(fields.0);
        let mut text = String::from("{");
        let pairs = head.into_iter().map(|(k, v)| (k.to_string(), v)).chain(
            rest.into_iter()
                .filter(|(k, _)| !matches!(k.as_str(), "ts" | "caller" | "msg" | "v" | "level")),
        );
        for (i, (key, value)) in pairs.enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&Value::String(key).to_string());
            text.push(':');
            text.push_str(&value.to_string());
        }
        text.push('}');
        writeln!(writer, "{text}")
    }
}

/// An event's fields as JSON values: numbers and booleans as such, the rest as text.
struct Fields(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for Fields {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    /// What `args` logs of a few events, in colour when `colour`.
    fn logged(args: &LogArgs, colour: bool) -> String {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(args.filter())
            .with(args.layer_to(buffer.clone(), colour));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile", service = "default/web");
            let _in = span.enter();
            tracing::info!(count = 3, ready = true, "synced");
            tracing::warn!(file = "a \"quoted\"\nname.yaml", "skipping manifest");
            tracing::debug!("only at -v 3 and up");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// Issue 47: every JSON line parses, with component-base's keys and the fields.
    #[test]
    fn json_lines_parse_as_json_with_kube_keys() {
        let args = LogArgs {
            logging_format: Format::Json,
            v: Some(2),
        };
        let text = logged(&args, true);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(text.starts_with("{\"ts\":"), "{text}");
        assert!(lines[0].to_string().contains("synced"));
        assert_eq!(lines[0]["msg"], "synced");
        assert_eq!(lines[0]["v"], 0);
        assert_eq!(lines[0]["count"], 3);
        assert_eq!(lines[0]["ready"], true);
        assert_eq!(lines[0]["service"], "default/web", "the span's field");
        assert!(lines[0]["ts"].as_f64().unwrap() > 1.7e9);
        assert!(lines[0]["caller"].as_str().unwrap().contains("logging.rs:"));
        assert_eq!(lines[1]["level"], "warn");
        assert_eq!(lines[1]["file"], "a \"quoted\"\nname.yaml");
        assert!(!text.contains('\x1b'), "{text:?}");
    }

    /// Issue 47: text without colour has no escape codes; with colour it has.
    #[test]
    fn no_escape_codes_without_a_terminal() {
        let args = LogArgs::default();
        let plain = logged(&args, false);
        assert!(plain.contains("synced"), "{plain}");
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(logged(&args, true).contains('\x1b'));
    }

    /// `-v` levels: debug from 3, trace from 5; 0 to 2 info.
    #[test]
    fn verbosity_maps_onto_levels() {
        for (v, level) in [
            (0, Level::INFO),
            (2, Level::INFO),
            (3, Level::DEBUG),
            (4, Level::DEBUG),
            (5, Level::TRACE),
            (9, Level::TRACE),
        ] {
            assert_eq!(level_for(v), level, "{v}");
            let args = LogArgs {
                v: Some(v),
                ..Default::default()
            };
            assert_eq!(
                args.filter().max_level_hint(),
                Some(LevelFilter::from(level)),
                "{v}"
            );
        }
        let debug = LogArgs {
            v: Some(4),
            ..Default::default()
        };
        assert!(logged(&debug, false).contains("only at -v 3 and up"));
    }
}
