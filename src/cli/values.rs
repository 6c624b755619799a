//! Value parsers for tritonserver's flag syntax. Each returns the message
//! clap prints after "invalid value '<v>' for '--<flag>'", so the flag is
//! always named.

/// tritonserver's booleans: `true|on|1` and `false|off|0`, any case.
pub fn boolean(arg: &str) -> Result<bool, String> {
    match arg.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(true),
        "false" | "off" | "0" => Ok(false),
        _ => Err("expected a boolean: true, false, on, off, 1 or 0".into()),
    }
}

/// `--log-verbose`: a level (0 = off) or, as tritonserver, `true` (1) / `false` (0).
pub fn verbose_level(arg: &str) -> Result<u32, String> {
    match arg.to_ascii_lowercase().as_str() {
        "true" => Ok(1),
        "false" => Ok(0),
        _ => arg
            .parse::<u32>()
            .map_err(|_| "expected a verbose level (an integer >= 0, or true/false)".into()),
    }
}

/// A count that must be at least 1 (a thread count, a pool size).
pub fn positive(arg: &str) -> Result<usize, String> {
    match arg.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected an integer >= 1".into()),
    }
}

/// `--metrics-interval-ms`: tritonserver documents a float; milliseconds > 0.
pub fn interval_ms(arg: &str) -> Result<f64, String> {
    match arg.parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(ms),
        _ => Err("expected a number of milliseconds > 0".into()),
    }
}

/// A non-negative finite number (`--min-supported-compute-capability`).
pub fn non_negative_float(arg: &str) -> Result<f64, String> {
    match arg.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("expected a number >= 0".into()),
    }
}

/// A non-empty string (`--model-config-name`, `--id`).
pub fn non_empty(arg: &str) -> Result<String, String> {
    if arg.is_empty() {
        Err("empty argument".into())
    } else {
        Ok(arg.to_owned())
    }
}

/// `<device id>:<bytes>` (`--cuda-memory-pool-byte-size`, `--cuda-virtual-address-size`).
pub fn device_bytes(arg: &str) -> Result<(u32, u64), String> {
    let err = || format!("expected <device id>:<bytes>, both integers >= 0; got {arg}");
    let (device, bytes) = arg.split_once(':').ok_or_else(err)?;
    Ok((
        device.parse().map_err(|_| err())?,
        bytes.parse().map_err(|_| err())?,
    ))
}

/// `<device id>:<fraction>` (`--model-load-gpu-limit`), the fraction in [0, 1].
pub fn device_fraction(arg: &str) -> Result<(u32, f64), String> {
    let err = || format!("expected <device id>:<fraction>, the fraction in [0, 1]; got {arg}");
    let (device, fraction) = arg.split_once(':').ok_or_else(err)?;
    let device = device.parse().map_err(|_| err())?;
    match fraction.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok((device, f)),
        _ => Err(err()),
    }
}

/// `<name>,<setting>=<value>`, every part non-empty (`--host-policy`, `--cache-config`).
pub fn named_setting(arg: &str) -> Result<(String, String, String), String> {
    let err = || format!("expected <name>,<setting>=<value>; got {arg}");
    let (name, rest) = arg.split_once(',').ok_or_else(err)?;
    let (setting, value) = rest.split_once('=').ok_or_else(err)?;
    if name.is_empty() || setting.is_empty() || value.is_empty() {
        return Err(err());
    }
    Ok((name.to_owned(), setting.to_owned(), value.to_owned()))
}

/// `<setting>=<value>` with no comma in the setting (`--metrics-config`):
/// checked here for form, its meaning at server start.
pub fn metrics_setting(arg: &str) -> Result<String, String> {
    let err = || format!("expected <setting>=<value>; got {arg}");
    let (setting, value) = arg.split_once('=').ok_or_else(err)?;
    if setting.is_empty() || value.is_empty() || setting.contains(',') {
        return Err(err());
    }
    Ok(arg.to_owned())
}

/// `<low>-<high>` (`--sagemaker-safe-port-range`).
pub fn port_range(arg: &str) -> Result<(u16, u16), String> {
    let err = || format!("expected <low port>-<high port>; got {arg}");
    let (low, high) = arg.split_once('-').ok_or_else(err)?;
    let (low, high) = (
        low.parse::<u16>().map_err(|_| err())?,
        high.parse::<u16>().map_err(|_| err())?,
    );
    if low > high {
        return Err(err());
    }
    Ok((low, high))
}

/// Milliseconds as a duration (the gRPC HTTP/2 limits).
pub fn millis(arg: &str) -> Result<std::time::Duration, String> {
    arg.parse::<u64>()
        .map(std::time::Duration::from_millis)
        .map_err(|_| "expected milliseconds, an integer >= 0".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_tritons() {
        for t in ["true", "TRUE", "on", "1"] {
            assert_eq!(boolean(t), Ok(true));
        }
        for f in ["false", "Off", "0"] {
            assert_eq!(boolean(f), Ok(false));
        }
        assert!(boolean("maybe").is_err());
        assert!(boolean("").is_err());
    }

    #[test]
    fn pairs_are_checked() {
        assert_eq!(device_bytes("0:1024"), Ok((0, 1024)));
        assert!(device_bytes("0").is_err());
        assert!(device_bytes("x:1").is_err());
        assert!(device_bytes("0:-1").is_err());
        assert_eq!(device_fraction("1:0.5"), Ok((1, 0.5)));
        assert!(device_fraction("1:1.5").is_err());
        assert!(named_setting("gpu_0,numa-node=0").is_ok());
        assert!(named_setting("gpu_0,numa-node").is_err());
        assert!(named_setting(",a=b").is_err());
        assert!(metrics_setting("summary_latencies=true").is_ok());
        assert!(metrics_setting("a,b=c").is_err());
        assert_eq!(port_range("8080-8090"), Ok((8080, 8090)));
        assert!(port_range("9-8").is_err());
        assert_eq!(verbose_level("true"), Ok(1));
        assert!(verbose_level("-1").is_err());
    }
}
