//! EC2's answers to `DescribeImages` (Query API, XML), read by the process that asks EC2 and
//! fuzzed here with the other parsers of untrusted bytes.
//!
//! Only what the answer needs is read: element structure, text and the five predefined entities
//! and character references. A declaration (`<?xml ...?>`) and comments are skipped; DOCTYPE,
//! CDATA and processing instructions elsewhere are refused, as EC2 never sends them. Names keep
//! their prefix (EC2 declares a default namespace, so its names have none).
//!
//! - A successful answer: `<DescribeImagesResponse><requestId/><imagesSet><item><imageId/>...
//!   <tpmSupport>v2.0</tpmSupport>...</item></imagesSet></DescribeImagesResponse>`; an image
//!   without NitroTPM support has no `tpmSupport` element.
//! - An error: `<Response><Errors><Error><Code/><Message/></Error></Errors><RequestID/>
//!   </Response>`.

/// The largest answer read: one image's description is a few kilobytes.
pub const MAX_ANSWER: usize = 256 * 1024;
/// The deepest nesting read: EC2's image answer nests six levels.
const MAX_DEPTH: usize = 32;

/// One image of a `DescribeImages` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageAnswer {
    pub image_id: String,
    /// `tpmSupport`, absent for an image that boots without a NitroTPM.
    pub tpm_support: Option<String>,
}

/// An EC2 error answer's first error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2ErrorAnswer {
    pub code: String,
    pub message: String,
}

/// Why an answer could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("EC2's answer is not {what}: {reason}")]
pub struct AnswerError {
    pub what: &'static str,
    pub reason: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Start(String),
    End,
    Text(String),
}

fn decode(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let end = after
            .find(';')
            .filter(|&e| e <= 10)
            .ok_or("an unterminated entity reference")?;
        let name = &after[..end];
        let c = match name {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = name.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = name.strip_prefix('#') {
                    dec.parse::<u32>().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown entity &{name};"))?
            }
        };
        out.push(c);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
}

/// The document's elements and text, checked to nest properly with one root.
fn events(xml: &[u8]) -> Result<Vec<Event>, String> {
    if xml.len() > MAX_ANSWER {
        return Err(format!("{} bytes, more than {MAX_ANSWER}", xml.len()));
    }
    let xml = std::str::from_utf8(xml).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut out = Vec::new();
    let mut open: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut rest = xml.trim_start_matches('\u{feff}');
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if open.is_empty() && rest.trim().is_empty() {
                break;
            }
            return Err("text outside the root element".to_owned());
        };
        let text = &rest[..lt];
        if !text.is_empty() {
            if open.is_empty() {
                if !text.trim().is_empty() {
                    return Err("text outside the root element".to_owned());
                }
            } else {
                out.push(Event::Text(decode(text)?));
            }
        }
        rest = &rest[lt..];
        if let Some(body) = rest.strip_prefix("<?") {
            if roots > 0 || !out.is_empty() || !body.starts_with("xml") {
                return Err("a processing instruction other than the declaration".to_owned());
            }
            let end = body.find("?>").ok_or("an unterminated declaration")?;
            rest = &body[end + 2..];
        } else if let Some(body) = rest.strip_prefix("<!--") {
            let end = body.find("-->").ok_or("an unterminated comment")?;
            rest = &body[end + 3..];
        } else if rest.starts_with("<!") {
            return Err("a DOCTYPE or CDATA section".to_owned());
        } else if let Some(body) = rest.strip_prefix("</") {
            let end = body.find('>').ok_or("an unterminated end tag")?;
            let name = body[..end].trim_end();
            match open.pop() {
                Some(top) if top == name => out.push(Event::End),
                Some(top) => return Err(format!("</{name}> closes <{top}>")),
                None => return Err(format!("</{name}> closes nothing")),
            }
            rest = &body[end + 1..];
        } else {
            let body = &rest[1..];
            let end = body.find('>').ok_or("an unterminated start tag")?;
            let mut tag = &body[..end];
            let empty = tag.ends_with('/');
            if empty {
                tag = &tag[..tag.len() - 1];
            }
            let name = tag
                .split(|c: char| c.is_ascii_whitespace())
                .next()
                .unwrap_or_default();
            if !is_name(name) {
                return Err(format!(
                    "a start tag with no valid name: <{}",
                    name.chars().take(40).collect::<String>()
                ));
            }
            if open.is_empty() {
                roots += 1;
                if roots > 1 {
                    return Err("more than one root element".to_owned());
                }
            }
            out.push(Event::Start(name.to_owned()));
            if empty {
                out.push(Event::End);
            } else {
                open.push(name);
                if open.len() > MAX_DEPTH {
                    return Err(format!("elements nested deeper than {MAX_DEPTH}"));
                }
            }
            rest = &body[end + 1..];
        }
    }
    if let Some(top) = open.last() {
        return Err(format!("<{top}> is never closed"));
    }
    if roots == 0 {
        return Err("no root element".to_owned());
    }
    Ok(out)
}

/// Calls `each(path, text)` for the text directly inside every element, with the names of the
/// elements enclosing it (root first); an element with no text reports "".
fn walk(xml: &[u8], mut each: impl FnMut(&[String], &str)) -> Result<(), String> {
    let mut path: Vec<String> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    for event in events(xml)? {
        match event {
            Event::Start(name) => {
                path.push(name);
                texts.push(String::new());
            }
            Event::Text(text) => {
                if let Some(t) = texts.last_mut() {
                    t.push_str(&text);
                }
            }
            Event::End => {
                let text = texts.pop().unwrap_or_default();
                each(&path, text.trim());
                path.pop();
            }
        }
    }
    Ok(())
}

/// The images of a `DescribeImagesResponse`, in answer order.
pub fn parse_describe_images(xml: &[u8]) -> Result<Vec<ImageAnswer>, AnswerError> {
    let error = |reason: String| AnswerError {
        what: "a DescribeImagesResponse",
        reason,
    };
    let mut root_ok = None;
    let mut images: Vec<ImageAnswer> = Vec::new();
    let mut current: Option<(Option<String>, Option<String>)> = None;
    walk(xml, |path, text| {
        let names: Vec<&str> = path.iter().map(String::as_str).collect();
        match names.as_slice() {
            [root] => root_ok = Some(*root == "DescribeImagesResponse"),
            ["DescribeImagesResponse", "imagesSet", "item", "imageId"] => {
                current.get_or_insert_default().0 = Some(text.to_owned());
            }
            ["DescribeImagesResponse", "imagesSet", "item", "tpmSupport"] => {
                current.get_or_insert_default().1 = Some(text.to_owned());
            }
            ["DescribeImagesResponse", "imagesSet", "item"] => {
                let (id, tpm) = current.take().unwrap_or_default();
                images.push(ImageAnswer {
                    image_id: id.unwrap_or_default(),
                    tpm_support: tpm.filter(|t| !t.is_empty()),
                });
            }
            _ => {}
        }
    })
    .map_err(error)?;
    match root_ok {
        Some(true) => {}
        _ => {
            return Err(error(
                "the root element is not DescribeImagesResponse".to_owned(),
            ));
        }
    }
    if let Some(nameless) = images.iter().find(|i| i.image_id.is_empty()) {
        return Err(error(format!(
            "an imagesSet item without imageId (tpmSupport {:?})",
            nameless.tpm_support
        )));
    }
    Ok(images)
}

/// The first error of an EC2 error answer (`<Response><Errors><Error>`).
pub fn parse_error(xml: &[u8]) -> Result<Ec2ErrorAnswer, AnswerError> {
    let error = |reason: String| AnswerError {
        what: "an EC2 error Response",
        reason,
    };
    let mut code = None;
    let mut message = None;
    walk(xml, |path, text| {
        let names: Vec<&str> = path.iter().map(String::as_str).collect();
        match names.as_slice() {
            ["Response", "Errors", "Error", "Code"] if code.is_none() => {
                code = Some(text.chars().take(100).collect());
            }
            ["Response", "Errors", "Error", "Message"] if message.is_none() => {
                message = Some(text.chars().take(300).collect());
            }
            _ => {}
        }
    })
    .map_err(error)?;
    Ok(Ec2ErrorAnswer {
        code: code.ok_or_else(|| error("no Errors/Error/Code".to_owned()))?,
        message: message.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// EC2's answer for one image, shaped as the API documents it.
    const TWO_IMAGES: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId>
    <imagesSet>
        <item>
            <imageId>ami-0a1b2c3d4e5f60718</imageId>
            <imageLocation>123456789012/constellation-v2.23.0</imageLocation>
            <imageState>available</imageState>
            <name>constellation &amp; co</name>
            <blockDeviceMapping>
                <item><deviceName>/dev/xvda</deviceName><ebs><volumeSize>10</volumeSize></ebs></item>
            </blockDeviceMapping>
            <bootMode>uefi</bootMode>
            <tpmSupport>v2.0</tpmSupport>
        </item>
        <item>
            <imageId>ami-12345678</imageId>
            <imageState>available</imageState>
            <tagSet/>
        </item>
    </imagesSet>
</DescribeImagesResponse>"#;

    #[test]
    fn images_and_their_tpm_support_are_read() {
        let images = parse_describe_images(TWO_IMAGES.as_bytes()).unwrap();
        assert_eq!(
            images,
            [
                ImageAnswer {
                    image_id: "ami-0a1b2c3d4e5f60718".into(),
                    tpm_support: Some("v2.0".into())
                },
                ImageAnswer {
                    image_id: "ami-12345678".into(),
                    tpm_support: None
                },
            ]
        );
        let empty = r#"<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>x</requestId><imagesSet/></DescribeImagesResponse>"#;
        assert!(parse_describe_images(empty.as_bytes()).unwrap().is_empty());
    }

    #[test]
    fn errors_are_read() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to perform this operation. User: arn:aws:sts::1:assumed-role/x is not &quot;allowed&quot;</Message></Error></Errors><RequestID>b1f2</RequestID></Response>"#;
        let e = parse_error(xml.as_bytes()).unwrap();
        assert_eq!(e.code, "UnauthorizedOperation");
        assert!(e.message.contains("not \"allowed\""), "{}", e.message);
    }

    #[test]
    fn malformed_answers_are_named() {
        for (xml, needle) in [
            ("", "no root element"),
            ("<a><b></a>", "</a> closes <b>"),
            ("<a>", "<a> is never closed"),
            ("<a/><b/>", "more than one root"),
            ("<a>&bogus;</a>", "unknown entity"),
            ("<!DOCTYPE a><a/>", "DOCTYPE"),
            ("<a><![CDATA[x]]></a>", "DOCTYPE or CDATA"),
            ("<Response/>", "not DescribeImagesResponse"),
            (
                "<DescribeImagesResponse><imagesSet><item><tpmSupport>v2.0</tpmSupport></item></imagesSet></DescribeImagesResponse>",
                "without imageId",
            ),
            ("x<a/>", "text outside"),
            ("<a/>x", "text outside"),
            ("< a/>", "no valid name"),
        ] {
            let err = parse_describe_images(xml.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(needle), "{xml}: {err}");
        }
        let mut big = b"<a>".to_vec();
        big.resize(MAX_ANSWER + 1, b' ');
        let err = parse_describe_images(&big).unwrap_err();
        assert!(err.to_string().contains("more than 262144"), "{err}");
        let deep = "<a>".repeat(40) + &"</a>".repeat(40);
        let err = parse_describe_images(deep.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("deeper"), "{err}");
        assert!(
            parse_error(b"<Response><Errors/></Response>")
                .unwrap_err()
                .to_string()
                .contains("no Errors/Error/Code")
        );
    }
}
