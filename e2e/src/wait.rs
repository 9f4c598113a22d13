//! The one way the test bed, the bench and the tests wait for something:
//! poll a check until it yields a value, fails, or time runs out.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Poll `check` every `every` until it returns `Ok(Some(v))` (then `v`),
/// returns an error (then that error, at once), or `timeout` has passed
/// (then an error naming `what`).
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// [`eventually`] for checks that cannot fail, in tests: poll `check`
/// every `every` until it returns `Some(v)` (then `v`); panic naming `what`
/// once `timeout` has passed.
pub async fn until_some<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = || {
        let c = check();
        async move { Ok(c.await) }
    };
    eventually(what, timeout, every, poll)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn yields_fails_or_times_out() {
        let ms = Duration::from_millis;
        let mut n = 0;
        let v = eventually("the third try", ms(500), ms(1), || {
            n += 1;
            let k = n;
            async move { Ok((k >= 3).then_some(k)) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        let e = eventually("a failing check", ms(500), ms(1), || async {
            anyhow::Result::<Option<()>>::Err(anyhow::anyhow!("broken"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "broken");
        let e = eventually("never", ms(20), ms(5), || async { Ok(None::<()>) })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("waiting for never"), "{e}");
    }
}
