//! Test certificates, made with openssl as an operator would (the manual
//! route the webhook's docs describe).

use std::path::Path;
use std::process::Command;

/// Run a command to its end: Ok, or its status and stderr.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr)))
    }
}

fn s(dir: &Path, file: &str) -> String {
    dir.join(file).to_str().expect("test paths are UTF-8").to_string()
}

/// A self-signed CA: `DIR/NAME.crt` and `DIR/NAME.key`.
pub fn ca(dir: &Path, name: &str) -> Result<(), String> {
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", &format!("/CN={name}")])
        .args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .args(["-keyout", &s(dir, &format!("{name}.key")), "-out", &s(dir, &format!("{name}.crt"))]))
}

/// A serving certificate signed by the CA `ca`: `DIR/NAME.crt` and `DIR/NAME.key`,
/// for the subject alternative names `san` (e.g. `IP:127.0.0.1,DNS:localhost`).
pub fn serving(dir: &Path, ca: &str, name: &str, san: &str, serial: u32) -> Result<(), String> {
    serving_dated(dir, ca, name, san, serial, None)
}

/// [`serving`], valid from `not_before` to `not_after` (`YYYYMMDDHHMMSSZ`)
/// instead of for two days from now (`openssl ca`: `openssl x509` 3.0 cannot
/// set the dates).
pub fn serving_dated(
    dir: &Path,
    ca: &str,
    name: &str,
    san: &str,
    serial: u32,
    dates: Option<(&str, &str)>,
) -> Result<(), String> {
    let (key, csr, ext, crt) = (
        s(dir, &format!("{name}.key")),
        s(dir, &format!("{name}.csr")),
        s(dir, &format!("{name}.ext")),
        s(dir, &format!("{name}.crt")),
    );
    run(Command::new("openssl")
        .args(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args(["-subj", &format!("/CN={name}"), "-keyout", &key, "-out", &csr]))?;
    std::fs::write(
        &ext,
        format!(
            "subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let Some((not_before, not_after)) = dates else {
        return run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-set_serial", &serial.to_string()])
            .args(["-in", &csr, "-CA", &s(dir, &format!("{ca}.crt")), "-CAkey", &s(dir, &format!("{ca}.key"))])
            .args(["-extfile", &ext, "-out", &crt]));
    };
    // `openssl ca` keeps a database of what it issued: a fresh one per certificate.
    let db = dir.join(format!("{name}.ca"));
    std::fs::create_dir_all(&db).map_err(|e| e.to_string())?;
    std::fs::write(db.join("index.txt"), "").map_err(|e| e.to_string())?;
    std::fs::write(db.join("serial"), format!("{serial:04X}\n")).map_err(|e| e.to_string())?;
    let config = db.join("openssl.cnf");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndefault_ca = test\n[test]\ndir = {}\ndatabase = $dir/index.txt\nserial = $dir/serial\nnew_certs_dir = $dir\ndefault_md = sha256\npolicy = any\nunique_subject = no\n[any]\ncommonName = supplied\n",
            db.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    run(Command::new("openssl")
        .args(["ca", "-batch", "-notext", "-config", &s(&db, "openssl.cnf")])
        .args(["-startdate", not_before, "-enddate", not_after])
        .args(["-cert", &s(dir, &format!("{ca}.crt")), "-keyfile", &s(dir, &format!("{ca}.key"))])
        .args(["-in", &csr, "-extfile", &ext, "-out", &crt]))
}
