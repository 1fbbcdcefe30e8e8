//! The dashboard's chart axes in headless Chromium: every y-axis label is
//! distinct and says its value, with no data (an axis of 1) as with some.

mod support;

use support::Ratewatch;

/// The y-axis labels of every `<svg class="chart" ...>` of `dom`, by tier.
fn y_ticks(dom: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find("<svg class=\"chart\"") {
        let svg = &rest[at..];
        let end = svg.find("</svg>").expect("a closed svg");
        let body = &svg[..end];
        let tier = body
            .split("data-tier=\"")
            .nth(1)
            .and_then(|t| t.split('"').next())
            .unwrap_or_default()
            .to_owned();
        let ticks = body
            .split("class=\"y-tick\">")
            .skip(1)
            .map(|t| t.split('<').next().unwrap().to_owned())
            .collect();
        out.push((tier, ticks));
        rest = &svg[end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_y_axis_label_is_distinct_with_no_data_and_with_some() {
    let server = Ratewatch::start("serve", None, &[]);
    let url = format!("{}/dashboard/?range=5m", server.url());
    let (dom, log) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || support::dump_dom(&url, 3_000)
    })
    .await
    .unwrap();
    let charts = y_ticks(&dom);
    assert!(!charts.is_empty(), "no tier chart drawn: {log}");
    for (tier, ticks) in &charts {
        assert_eq!(
            ticks,
            &["0", "1"],
            "{tier}: an empty chart's axis is 0 and 1"
        );
    }

    // Three decisions of one tier: an axis of 5, labelled 0 to 5.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        client
            .get(format!("{}/api/users", server.url()))
            .header("x-api-key", "free_ticks_000000001")
            .send()
            .await
            .unwrap();
    }
    let charts = support::eventually(
        std::time::Duration::from_secs(15),
        "decisions drawn",
        || {
            let url = url.clone();
            async move {
                let (dom, _) = tokio::task::spawn_blocking(move || support::dump_dom(&url, 3_000))
                    .await
                    .unwrap();
                let charts = y_ticks(&dom);
                charts
                    .iter()
                    .any(|(tier, ticks)| tier == "free" && ticks.len() > 2)
                    .then_some(charts)
            }
        },
    )
    .await;
    for (tier, ticks) in &charts {
        let mut distinct = ticks.clone();
        distinct.dedup();
        assert_eq!(&distinct, ticks, "{tier}: labels repeat");
        let values: Vec<f64> = ticks.iter().map(|t| t.parse().unwrap()).collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "{tier}: {ticks:?}");
    }
    let free = &charts.iter().find(|(t, _)| t == "free").unwrap().1;
    assert_eq!(free, &["0", "1", "2", "3", "4", "5"]);
}
