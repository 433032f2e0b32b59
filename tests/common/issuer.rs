//! A token issuer made in the test: fresh RSA (openssl) and P-256 (ring) key pairs, their JWKS,
//! and signed runtime tokens.

use std::path::Path;
use std::process::Command;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

pub struct Issuer {
    pub iss: String,
    rsa_pkcs1: Vec<u8>,
    ec_pkcs8: Vec<u8>,
    pub jwks: Value,
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    STANDARD.decode(body).unwrap()
}

/// A 2048-bit RSA key in PKCS#8 DER, made by openssl.
fn rsa_key() -> Vec<u8> {
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl is needed to make a test RSA key");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pem_to_der(&String::from_utf8(out.stdout).unwrap())
}

impl Issuer {
    pub fn new(iss: &str) -> Self {
        let rsa_pkcs8 = rsa_key();
        let rsa = ring::rsa::KeyPair::from_pkcs8(&rsa_pkcs8).unwrap();
        let parts = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(rsa.public());
        let rng = SystemRandom::new();
        let ec_pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap()
            .as_ref()
            .to_vec();
        let ec =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &ec_pkcs8, &rng).unwrap();
        let point = ec.public_key().as_ref(); // 0x04 || x || y
        let jwks = json!({ "keys": [
            { "kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig",
              "n": URL_SAFE_NO_PAD.encode(&parts.n), "e": URL_SAFE_NO_PAD.encode(&parts.e) },
            { "kty": "EC", "kid": "ec-1", "crv": "P-256", "alg": "ES256", "use": "sig",
              "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65]) },
        ]});
        let rsa_pkcs1 = pkcs1_of(&rsa_pkcs8);
        Self {
            iss: iss.to_owned(),
            rsa_pkcs1,
            ec_pkcs8,
            jwks,
        }
    }

    pub fn write_jwks(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("jwks.json");
        std::fs::write(&path, self.jwks.to_string()).unwrap();
        path
    }

    /// Claims for a repository and grants, issued by this issuer, valid for an hour.
    pub fn claims(&self, repository: &str, grants: &[(&str, u8)]) -> Value {
        let mut c = super::claims(repository, grants);
        c["iss"] = json!(self.iss);
        c["aud"] = json!("vso:test");
        c
    }

    pub fn rs256(&self, claims: &Value) -> String {
        self.rs256_with_kid(claims, Some("rsa-1"))
    }

    pub fn rs256_with_kid(&self, claims: &Value, kid: Option<&str>) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(&self.rsa_pkcs1)).unwrap()
    }

    pub fn es256(&self, claims: &Value) -> String {
        self.es256_with_kid(claims, "ec-1")
    }

    pub fn es256_with_kid(&self, claims: &Value, kid: &str) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&self.ec_pkcs8)).unwrap()
    }

    /// A token for `repository` with `grants`, RS256.
    pub fn token(&self, repository: &str, grants: &[(&str, u8)]) -> String {
        self.rs256(&self.claims(repository, grants))
    }
}

/// jsonwebtoken wants PKCS#1 for RSA; openssl made PKCS#8.
fn pkcs1_of(pkcs8: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["rsa", "-inform", "DER", "-outform", "DER", "-traditional"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pkcs8).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}
