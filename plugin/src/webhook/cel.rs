//! The part of DRA's CEL that device selectors most often use, evaluated on published devices,
//! so the webhook can tell which devices a DeviceClass or a request could be given.
//!
//! Supported: `device.driver`, `device.attributes["domain"].name` (or `["name"]`), string, int
//! and bool literals, `==`, `!=`, `<`, `<=`, `>`, `>=` on ints, `!`, `&&`, `||` and parentheses.
//! Anything else (functions such as `semver()` or `startsWith`, `in`, `device.capacity`) is
//! [`CelError::Unsupported`]: the webhook then does not judge the ask, so an expression it cannot
//! read never makes it refuse a pod the scheduler could place. A missing attribute is a runtime
//! error, as in Kubernetes, and the device does not match.

use std::collections::BTreeMap;

/// An attribute's value, as a ResourceSlice carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    /// `string`.
    Str(String),
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `version` (compared only for equality).
    Version(String),
}

/// A device as a selector sees it: its driver and its attributes by domain, then name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CelDevice {
    /// The driver that published it.
    pub driver: String,
    /// Attributes by domain (the driver's own for unqualified names), then by name.
    pub attributes: BTreeMap<String, BTreeMap<String, AttrValue>>,
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression uses what this evaluator does not read; the ask is not judged.
    #[error("the selector uses {0}, which the webhook does not evaluate")]
    Unsupported(String),
    /// Evaluation failed on this device (a missing attribute, mismatched types): no match.
    #[error("{0}")]
    Runtime(String),
}

/// Whether `device` satisfies `expression`.
pub fn matches(expression: &str, device: &CelDevice) -> Result<bool, CelError> {
    let tokens = lex(expression)?;
    let mut p = Parser { tokens, at: 0 };
    let expr = p.or()?;
    if p.at != p.tokens.len() {
        return Err(CelError::Unsupported(format!(
            "{:?} after a complete expression",
            p.tokens[p.at]
        )));
    }
    match eval(&expr, device)? {
        Value::Bool(b) => Ok(b),
        other => Err(CelError::Runtime(format!(
            "the selector gives {other:?}, not a bool"
        ))),
    }
}

/// Whether `expression` can be read by [`matches`] at all (parsing only).
pub fn supported(expression: &str) -> Result<(), CelError> {
    let tokens = lex(expression)?;
    let mut p = Parser { tokens, at: 0 };
    p.or()?;
    if p.at != p.tokens.len() {
        return Err(CelError::Unsupported("trailing tokens".into()));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Int(i64),
    Op(&'static str),
}

const OPS: [&str; 14] = [
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".",
];

fn lex(s: &str) -> Result<Vec<Token>, CelError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' {
            let mut j = i + 1;
            let mut text = String::new();
            while j < chars.len() && chars[j] != c {
                if chars[j] == '\\' {
                    return Err(CelError::Unsupported("escapes in string literals".into()));
                }
                text.push(chars[j]);
                j += 1;
            }
            if j >= chars.len() {
                return Err(CelError::Unsupported("an unterminated string".into()));
            }
            out.push(Token::Str(text));
            i = j + 1;
        } else if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            let text: String = chars[i..j].iter().collect();
            let n = text
                .parse()
                .map_err(|_| CelError::Unsupported(format!("the number {text}")))?;
            out.push(Token::Int(n));
            i = j;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut j = i;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            out.push(Token::Ident(chars[i..j].iter().collect()));
            i = j;
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let Some(op) = OPS.iter().find(|op| rest.starts_with(**op)) else {
                return Err(CelError::Unsupported(format!("the character {c:?}")));
            };
            out.push(Token::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

#[derive(Debug)]
enum Expr {
    Lit(Value),
    Device,
    Field(Box<Expr>, String),
    Not(Box<Expr>),
    Bin(&'static str, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Version(String),
    Attributes,
    Domain(String),
    Device,
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token::Op(o)) if *o == op)
    }

    fn expect_op(&mut self, op: &str) -> Result<(), CelError> {
        if self.peek_op(op) {
            self.at += 1;
            Ok(())
        } else {
            Err(CelError::Unsupported(format!(
                "{:?} where {op:?} was expected",
                self.tokens.get(self.at)
            )))
        }
    }

    fn or(&mut self) -> Result<Expr, CelError> {
        let mut left = self.and()?;
        while self.peek_op("||") {
            self.at += 1;
            left = Expr::Bin("||", Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, CelError> {
        let mut left = self.relation()?;
        while self.peek_op("&&") {
            self.at += 1;
            left = Expr::Bin("&&", Box::new(left), Box::new(self.relation()?));
        }
        Ok(left)
    }

    fn relation(&mut self) -> Result<Expr, CelError> {
        let left = self.unary()?;
        for op in ["==", "!=", "<=", ">=", "<", ">"] {
            if self.peek_op(op) {
                self.at += 1;
                let right = self.unary()?;
                let op = OPS.iter().find(|o| **o == op).copied().unwrap_or("==");
                return Ok(Expr::Bin(op, Box::new(left), Box::new(right)));
            }
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, CelError> {
        if self.peek_op("!") {
            self.at += 1;
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        self.member()
    }

    fn member(&mut self) -> Result<Expr, CelError> {
        let mut e = self.primary()?;
        loop {
            if self.peek_op(".") {
                self.at += 1;
                match self.tokens.get(self.at).cloned() {
                    Some(Token::Ident(name)) => {
                        self.at += 1;
                        if self.peek_op("(") {
                            return Err(CelError::Unsupported(format!("the function {name}()")));
                        }
                        e = Expr::Field(Box::new(e), name);
                    }
                    other => {
                        return Err(CelError::Unsupported(format!("{other:?} after a dot")));
                    }
                }
            } else if self.peek_op("[") {
                self.at += 1;
                let key = match self.tokens.get(self.at).cloned() {
                    Some(Token::Str(s)) => s,
                    other => {
                        return Err(CelError::Unsupported(format!("the index {other:?}")));
                    }
                };
                self.at += 1;
                self.expect_op("]")?;
                e = Expr::Field(Box::new(e), key);
            } else {
                return Ok(e);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, CelError> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        match t {
            Some(Token::Str(s)) => Ok(Expr::Lit(Value::Str(s))),
            Some(Token::Int(n)) => Ok(Expr::Lit(Value::Int(n))),
            Some(Token::Ident(i)) if i == "true" => Ok(Expr::Lit(Value::Bool(true))),
            Some(Token::Ident(i)) if i == "false" => Ok(Expr::Lit(Value::Bool(false))),
            Some(Token::Ident(i)) if i == "device" => Ok(Expr::Device),
            Some(Token::Op("(")) => {
                let e = self.or()?;
                self.expect_op(")")?;
                Ok(e)
            }
            Some(Token::Ident(i)) => Err(CelError::Unsupported(format!("the name {i}"))),
            other => Err(CelError::Unsupported(format!("{other:?}"))),
        }
    }
}

fn eval(e: &Expr, d: &CelDevice) -> Result<Value, CelError> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Device => Ok(Value::Device),
        Expr::Field(base, name) => match (eval(base, d)?, name.as_str()) {
            (Value::Device, "driver") => Ok(Value::Str(d.driver.clone())),
            (Value::Device, "attributes") => Ok(Value::Attributes),
            (Value::Device, other) => Err(CelError::Unsupported(format!("device.{other}"))),
            (Value::Attributes, domain) => Ok(Value::Domain(domain.to_string())),
            (Value::Domain(domain), attr) => {
                match d.attributes.get(&domain).and_then(|a| a.get(attr)) {
                    Some(AttrValue::Str(s)) => Ok(Value::Str(s.clone())),
                    Some(AttrValue::Int(n)) => Ok(Value::Int(*n)),
                    Some(AttrValue::Bool(b)) => Ok(Value::Bool(*b)),
                    Some(AttrValue::Version(v)) => Ok(Value::Version(v.clone())),
                    None => Err(CelError::Runtime(format!(
                        "no such key: attribute {attr} of domain {domain}"
                    ))),
                }
            }
            (other, name) => Err(CelError::Runtime(format!("{other:?} has no field {name}"))),
        },
        Expr::Not(inner) => match eval(inner, d)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            other => Err(CelError::Runtime(format!("! of {other:?}"))),
        },
        Expr::Bin(op @ ("&&" | "||"), l, r) => {
            // CEL's logical operators are commutative over errors: a decisive side wins.
            let decisive = *op == "||";
            let (l, r) = (eval(l, d), eval(r, d));
            for side in [&l, &r] {
                if let Ok(Value::Bool(b)) = side
                    && *b == decisive
                {
                    return Ok(Value::Bool(decisive));
                }
            }
            for side in [l, r] {
                match side? {
                    Value::Bool(_) => {}
                    other => return Err(CelError::Runtime(format!("{op} of {other:?}"))),
                }
            }
            Ok(Value::Bool(!decisive))
        }
        Expr::Bin(op, l, r) => {
            let (l, r) = (eval(l, d)?, eval(r, d)?);
            match (*op, &l, &r) {
                ("==", _, _) if same_type(&l, &r) => Ok(Value::Bool(l == r)),
                ("!=", _, _) if same_type(&l, &r) => Ok(Value::Bool(l != r)),
                (_, Value::Int(a), Value::Int(b)) => Ok(Value::Bool(match *op {
                    "<" => a < b,
                    "<=" => a <= b,
                    ">" => a > b,
                    ">=" => a >= b,
                    _ => return Err(CelError::Runtime(format!("{op} on ints"))),
                })),
                _ => Err(CelError::Runtime(format!(
                    "no such overload: {l:?} {op} {r:?}"
                ))),
            }
        }
    }
}

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> CelDevice {
        let mut own = BTreeMap::new();
        own.insert("type".to_string(), AttrValue::Str("device".into()));
        own.insert("family".to_string(), AttrValue::Str("exclusive".into()));
        own.insert("numa".to_string(), AttrValue::Int(1));
        own.insert("healthy".to_string(), AttrValue::Bool(true));
        let mut std = BTreeMap::new();
        std.insert(
            "pciBusID".to_string(),
            AttrValue::Str("0000:17:00.0".into()),
        );
        CelDevice {
            driver: "accel.nri.io".into(),
            attributes: BTreeMap::from([
                ("accel.nri.io".to_string(), own),
                ("resource.kubernetes.io".to_string(), std),
            ]),
        }
    }

    #[test]
    fn the_shipped_classes_read_as_the_scheduler_reads_them() {
        let d = gpu();
        let class = r#"device.driver == "accel.nri.io" &&
            device.attributes["accel.nri.io"].type == "device" &&
            device.attributes["accel.nri.io"].family == "exclusive""#;
        assert_eq!(matches(class, &d), Ok(true));
        let shared = r#"device.driver == "accel.nri.io" && device.attributes["accel.nri.io"].type == "shared""#;
        assert_eq!(matches(shared, &d), Ok(false));
        assert_eq!(
            matches(
                r#"device.attributes["resource.kubernetes.io"]["pciBusID"] == '0000:17:00.0'"#,
                &d
            ),
            Ok(true)
        );
        assert_eq!(
            matches(
                r#"device.attributes["accel.nri.io"].numa >= 1 && !(device.attributes["accel.nri.io"].healthy == false)"#,
                &d
            ),
            Ok(true)
        );
        assert_eq!(
            matches(r#"device.driver != "accel.nri.io" || false"#, &d),
            Ok(false)
        );
    }

    #[test]
    fn a_missing_attribute_is_a_runtime_error_unless_a_side_decides() {
        let d = gpu();
        let missing = r#"device.attributes["accel.nri.io"].model == "H100""#;
        assert!(matches!(matches(missing, &d), Err(CelError::Runtime(_))));
        assert_eq!(
            matches(&format!("device.driver == \"other\" && {missing}"), &d),
            Ok(false)
        );
        assert_eq!(
            matches(
                &format!("{missing} || device.driver == \"accel.nri.io\""),
                &d
            ),
            Ok(true)
        );
    }

    #[test]
    fn what_it_cannot_read_is_unsupported_not_false() {
        let d = gpu();
        for e in [
            r#"device.attributes["accel.nri.io"].model.startsWith("H")"#,
            r#""model" in device.attributes["accel.nri.io"]"#,
            r#"device.capacity["accel.nri.io"].memory.compareTo(quantity("1Gi")) >= 0"#,
            r#"device.attributes["accel.nri.io"].v == semver("1.0.0")"#,
            "device.driver == \"a\\\"b\"",
        ] {
            assert!(
                matches!(matches(e, &d), Err(CelError::Unsupported(_))),
                "{e}: {:?}",
                matches(e, &d)
            );
        }
        assert!(supported(r#"device.driver == "x""#).is_ok());
    }
}
