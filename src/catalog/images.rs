//! Product pictures: what an upload must be, and what is kept of it.
//!
//! An upload is trusted for nothing. It must be at most [`MAX_UPLOAD_BYTES`], start like a
//! PNG, JPEG or WebP file, and decode in full under [`image::Limits`] (at most
//! [`MAX_SIDE`] pixels a side and [`MAX_DECODE_BYTES`] of memory), so a small file that
//! declares a vast picture (a decompression bomb) is refused from its header, before
//! anything is allocated. A JPEG is decoded strictly (zune-jpeg's strict mode, which the
//! `image` crate turns off): data that ends before the picture does, or is damaged on the
//! way, is refused rather than filled in with grey. And it must be able to hold what it
//! declares ([`MAX_JPEG_PIXELS_PER_BYTE`]), checked from its header before decoding, so a
//! few hundred bytes declaring 6000 × 6000 cost no second of CPU. What is kept is never the upload itself but a fresh JPEG of the
//! decoded pixels, at most [`IMAGE_SIDE`] a side, and a [`THUMB_SIDE`] thumbnail; each
//! carries the hash of its bytes as its ETag. Rows live in `product_images` (see its
//! migration for why PostgreSQL rather than a folder).

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, ImageReader, Limits, RgbImage};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::Sku;

/// The largest upload accepted, in bytes (5 MiB).
pub const MAX_UPLOAD_BYTES: usize = 5 * 1024 * 1024;
/// The widest or tallest picture decoded, in pixels (a phone photo fits).
pub const MAX_SIDE: u32 = 6_000;
/// The most memory one decode may take.
pub const MAX_DECODE_BYTES: u64 = 128 * 1024 * 1024;
/// The product page's picture: at most this many pixels a side.
pub const IMAGE_SIDE: u32 = 800;
/// The catalogue's thumbnail: at most this many pixels a side.
pub const THUMB_SIDE: u32 = 320;
/// The most pixels a JPEG may declare per byte of its file. Every 8 × 8 block costs at
/// least one bit of coded data (its DC coefficient's Huffman code; codes are 1 to 16 bits),
/// so even a one-colour grey picture needs a byte per 512 pixels; twice that is room for
/// any real file. More pixels than this and the data for them is missing: decoding would
/// only spend CPU inventing them.
pub const MAX_JPEG_PIXELS_PER_BYTE: u64 = 1_024;
/// JPEG quality of what is kept.
const QUALITY: u8 = 82;

/// Why an upload was refused; the message is for the admin who sent it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the file is empty: choose a PNG, JPEG or WebP picture")]
    Empty,
    #[error("the file is {0} bytes; pictures may be at most 5 MB")]
    TooLarge(usize),
    #[error("this is not a PNG, JPEG or WebP picture")]
    NotAnImage,
    #[error("the picture is too big to open: at most {MAX_SIDE} × {MAX_SIDE} pixels ({0})")]
    TooManyPixels(String),
    #[error("the picture could not be read; it may be damaged ({0})")]
    Damaged(String),
}

/// A picture ready to store: re-encoded bytes and their ETags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processed {
    pub image: Vec<u8>,
    pub image_etag: String,
    pub thumb: Vec<u8>,
    pub thumb_etag: String,
    pub width: u32,
    pub height: u32,
}

impl Processed {
    /// Pictures already re-encoded (here, or the demo's, committed), with their ETags.
    pub fn stored(image: Vec<u8>, thumb: Vec<u8>, width: u32, height: u32) -> Self {
        Self {
            image_etag: etag(&image),
            thumb_etag: etag(&thumb),
            image,
            thumb,
            width,
            height,
        }
    }
}

/// Checks and re-encodes an uploaded picture.
pub fn process(bytes: &[u8]) -> Result<Processed, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() > MAX_UPLOAD_BYTES {
        return Err(ImageError::TooLarge(bytes.len()));
    }
    let format = image::guess_format(bytes).map_err(|_| ImageError::NotAnImage)?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP
    ) {
        return Err(ImageError::NotAnImage);
    }
    let decoded = match format {
        ImageFormat::Jpeg => decode_jpeg(bytes)?,
        _ => decode(bytes, format)?,
    };
    let fitted = shrink(decoded, IMAGE_SIDE);
    let (width, height) = (fitted.width(), fitted.height());
    let thumb = jpeg(&shrink(fitted.clone(), THUMB_SIDE))?;
    let image = jpeg(&fitted)?;
    Ok(Processed::stored(image, thumb, width, height))
}

/// A PNG or WebP decoded by `image` under [`Limits`]; its decoders fail on data that ends
/// early.
fn decode(bytes: &[u8], format: ImageFormat) -> Result<DynamicImage, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    reader.decode().map_err(|e| match e {
        image::ImageError::Limits(e) => ImageError::TooManyPixels(e.to_string()),
        image::ImageError::Unsupported(_) => ImageError::NotAnImage,
        other => ImageError::Damaged(other.to_string()),
    })
}

/// A JPEG decoded in strict mode, after its header showed a size within the limits that
/// its bytes can hold. (`image`'s JPEG decoder runs zune-jpeg leniently: a file that ends
/// early, or whose data runs into a marker, comes out with the rest painted grey, and a
/// warning only in a log.)
fn decode_jpeg(bytes: &[u8]) -> Result<DynamicImage, ImageError> {
    use zune_core::{bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions};
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        // The sides are checked below, in this module's words.
        .set_max_width(usize::MAX)
        .set_max_height(usize::MAX)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let damaged = |e: zune_jpeg::errors::DecodeErrors| ImageError::Damaged(e.to_string());
    decoder.decode_headers().map_err(damaged)?;
    let (w, h) = decoder.dimensions().expect("headers decoded");
    let (width, height) = (w as u64, h as u64);
    if width > u64::from(MAX_SIDE) || height > u64::from(MAX_SIDE) {
        return Err(ImageError::TooManyPixels(format!(
            "this one is {width} × {height}"
        )));
    }
    if width * height * 3 > MAX_DECODE_BYTES {
        return Err(ImageError::TooManyPixels(format!(
            "{width} × {height} would take more than {} MiB to open",
            MAX_DECODE_BYTES >> 20
        )));
    }
    if width * height > bytes.len() as u64 * MAX_JPEG_PIXELS_PER_BYTE {
        return Err(ImageError::Damaged(format!(
            "it declares {width} × {height} pixels, more than {} bytes can hold",
            bytes.len()
        )));
    }
    let pixels = decoder.decode().map_err(damaged)?;
    let picture = match decoder.output_colorspace() {
        Some(ColorSpace::RGB) => {
            RgbImage::from_raw(width as u32, height as u32, pixels).map(DynamicImage::from)
        }
        Some(ColorSpace::Luma) => {
            image::GrayImage::from_raw(width as u32, height as u32, pixels).map(DynamicImage::from)
        }
        _ => None,
    };
    picture.ok_or(ImageError::NotAnImage)
}

/// `picture` made to fit `side` × `side`, keeping its proportions; never enlarged.
fn shrink(picture: DynamicImage, side: u32) -> DynamicImage {
    match picture.width() > side || picture.height() > side {
        true => picture.thumbnail(side, side),
        false => picture,
    }
}

/// A JPEG of `picture`, transparent parts laid on white.
fn jpeg(picture: &DynamicImage) -> Result<Vec<u8>, ImageError> {
    let rgba = picture.to_rgba8();
    let rgb = RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let over_white =
            |c: u8| ((u16::from(c) * u16::from(a) + 255 * (255 - u16::from(a))) / 255) as u8;
        image::Rgb([over_white(r), over_white(g), over_white(b)])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, QUALITY)
        .encode_image(&rgb)
        .map_err(|e| ImageError::Damaged(e.to_string()))?;
    Ok(out)
}

/// A strong ETag: the quoted start of the bytes' SHA-256.
fn etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &hex::encode(Sha256::digest(bytes))[..32])
}

/// Which of a product's pictures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Full,
    Thumb,
}

/// A stored picture's bytes and ETag.
#[derive(Debug)]
pub struct Stored {
    pub bytes: Vec<u8>,
    pub etag: String,
    pub content_type: String,
}

/// Stores (or replaces) `sku`'s picture; false when there is no such product.
#[tracing::instrument(skip_all)]
pub async fn save(
    db: impl sqlx::PgExecutor<'_>,
    sku: &Sku,
    picture: &Processed,
    actor: &str,
) -> sqlx::Result<bool> {
    let saved = sqlx::query!(
        r#"insert into product_images
               (sku, image, image_etag, thumb, thumb_etag, content_type, width, height, updated_by)
           select p.sku, $2, $3, $4, $5, 'image/jpeg', $6, $7, $8 from products p where p.sku = $1
           on conflict (sku) do update
              set image = excluded.image, image_etag = excluded.image_etag,
                  thumb = excluded.thumb, thumb_etag = excluded.thumb_etag,
                  content_type = excluded.content_type, width = excluded.width,
                  height = excluded.height, updated_at = now(), updated_by = excluded.updated_by"#,
        sku.as_str(),
        &picture.image,
        &picture.image_etag,
        &picture.thumb,
        &picture.thumb_etag,
        picture.width as i32,
        picture.height as i32,
        actor,
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(saved == 1)
}

/// A picture's version in its address (`?v=…`): the first 12 characters of its ETag.
pub fn version(etag: &str) -> &str {
    let etag = etag.trim_matches('"');
    etag.get(..12).unwrap_or(etag)
}

/// Whose pictures [`find`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Products on sale only: the shop's pictures.
    OnSale,
    /// Any product's, hidden ones too: the admin's.
    Any,
}

/// A product's picture, if it has one (and it is on sale, for [`Shown::OnSale`]).
#[tracing::instrument(skip_all, fields(sku = %sku))]
pub async fn find(
    pool: &PgPool,
    sku: &Sku,
    size: Size,
    shown: Shown,
) -> sqlx::Result<Option<Stored>> {
    let hidden_too = shown == Shown::Any;
    // Only the chosen size's bytes are read (and detoasted).
    let full = size == Size::Full;
    sqlx::query_as!(
        Stored,
        r#"select case when $3 then i.image else i.thumb end as "bytes!",
                  case when $3 then i.image_etag else i.thumb_etag end as "etag!",
                  i.content_type
             from product_images i join products p on p.sku = i.sku
            where i.sku = $1 and (p.active or $2)"#,
        sku.as_str(),
        hidden_too,
        full,
    )
    .fetch_optional(pool)
    .await
}

/// Whether an `If-None-Match` header value names `etag` (or is `*`).
pub fn matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let picture = image::RgbaImage::from_fn(width, height, |x, y| {
            image::Rgba([
                (x % 256) as u8,
                (y % 256) as u8,
                90,
                if x < 5 { 0 } else { 255 },
            ])
        });
        let mut out = Vec::new();
        DynamicImage::ImageRgba8(picture)
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn a_picture_is_re_encoded_to_fit_with_a_thumbnail() {
        let done = process(&png(1600, 400)).unwrap();
        assert_eq!((done.width, done.height), (800, 200));
        let image = image::load_from_memory(&done.image).unwrap();
        assert_eq!((image.width(), image.height()), (800, 200));
        let thumb = image::load_from_memory(&done.thumb).unwrap();
        assert_eq!((thumb.width(), thumb.height()), (320, 80));
        assert_eq!(image::guess_format(&done.image).unwrap(), ImageFormat::Jpeg);
        assert_ne!(done.image_etag, done.thumb_etag);
        assert_eq!(
            done.image_etag,
            process(&png(1600, 400)).unwrap().image_etag
        );
        // Small pictures are not blown up.
        let small = process(&png(100, 60)).unwrap();
        assert_eq!((small.width, small.height), (100, 60));
    }

    #[test]
    fn what_is_not_a_readable_picture_is_refused() {
        assert_eq!(process(b""), Err(ImageError::Empty));
        assert_eq!(process(b"hello, world"), Err(ImageError::NotAnImage));
        assert_eq!(
            process(b"GIF89a\x01\x00\x01\x00"),
            Err(ImageError::NotAnImage)
        );
        let mut cut = png(50, 50);
        cut.truncate(60);
        assert!(matches!(process(&cut), Err(ImageError::Damaged(_))));
        assert!(matches!(
            process(&vec![0; MAX_UPLOAD_BYTES + 1]),
            Err(ImageError::TooLarge(_))
        ));
    }

    /// A 70-byte PNG that declares `side` × `side` pixels and holds none.
    pub fn bomb(side: u32) -> Vec<u8> {
        fn crc32(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in bytes {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0xEDB8_8320
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [
            (
                &b"IHDR"[..],
                [
                    &side.to_be_bytes()[..],
                    &side.to_be_bytes(),
                    &[8, 6, 0, 0, 0],
                ]
                .concat(),
            ),
            // An empty zlib stream: the decoder reads this far before it looks at the size.
            (
                b"IDAT",
                vec![0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
            ),
            (b"IEND", Vec::new()),
        ] {
            png.extend((data.len() as u32).to_be_bytes());
            let body = [kind, &data].concat();
            png.extend(&body);
            png.extend(crc32(&body).to_be_bytes());
        }
        png
    }

    #[test]
    fn a_small_file_declaring_a_vast_picture_is_refused_from_its_header() {
        let bomb = bomb(50_000);
        assert!(bomb.len() < 100);
        let err = process(&bomb).unwrap_err();
        assert!(matches!(err, ImageError::TooManyPixels(_)), "{err:?}");
        assert!(err.to_string().contains("too big to open"), "{err}");
        // Within the side limit, the memory limit still holds: 6000 × 6000 × 4 bytes > 128 MiB.
        let err = process(&super::tests::bomb(MAX_SIDE)).unwrap_err();
        assert!(matches!(err, ImageError::TooManyPixels(_)), "{err:?}");
    }

    /// A `width` × `height` JPEG of noise (which compresses badly, as photos do).
    pub fn noisy_jpeg(width: u32, height: u32) -> Vec<u8> {
        let mut seed = 7u32;
        let picture = RgbImage::from_fn(width, height, |_, _| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let [a, b, c, _] = seed.to_be_bytes();
            image::Rgb([a, b, c])
        });
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
            .encode_image(&picture)
            .unwrap();
        out
    }

    /// `jpeg` with the size in its frame header (SOF0) replaced: a file that says it is
    /// `width` × `height` and holds the data of what it was.
    pub fn declaring(mut jpeg: Vec<u8>, width: u16, height: u16) -> Vec<u8> {
        let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        // FF C0, length (2), precision (1), height (2), width (2).
        jpeg[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
        jpeg[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
        jpeg
    }

    #[test]
    fn a_jpeg_whose_data_ends_before_its_picture_is_refused() {
        let whole = noisy_jpeg(100, 80);
        assert_eq!(process(&whole).unwrap().width, 100);
        // Cut in the middle of its data: the lenient decoder painted the rest grey.
        let mut cut = whole.clone();
        cut.truncate(whole.len() * 2 / 3);
        let err = process(&cut).unwrap_err();
        assert!(matches!(err, ImageError::Damaged(_)), "{err:?}");
        // Declaring 6000 × 6000 in a small file: refused from the header, in no time.
        let mut vast = declaring(whole, 6_000, 6_000);
        vast.truncate(769);
        let started = std::time::Instant::now();
        let err = process(&vast).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
        assert!(
            err.to_string()
                .contains("declares 6000 × 6000 pixels, more than 769 bytes"),
            "{err}"
        );
    }

    #[test]
    fn if_none_match_lists_are_read() {
        assert!(matches("\"a\"", "\"a\""));
        assert!(matches("\"x\", W/\"a\"", "\"a\""));
        assert!(matches("*", "\"a\""));
        assert!(!matches("\"b\"", "\"a\""));
    }
}
