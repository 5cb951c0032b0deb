//! The route table: every public route, grouped by path into resources (405 with `Allow`
//! for any other method) and by prefix into scopes; the admin's are in [`super::admin`].

use super::*;

/// A route for GET, which also answers HEAD (the same headers, no body), as monitors and
/// link checkers expect.
pub(crate) fn get() -> actix_web::Route {
    use actix_web::guard;
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// Every public route: `(method, path, handler)`. A GET route answers HEAD too. The admin's
/// routes are listed in [`admin::routes`].
pub(super) fn public_routes() -> Vec<(Method, &'static str, actix_web::Route)> {
    use Method as M;
    vec![
        (M::GET, "/", get().to(shop::catalogue::get_catalogue)),
        (
            M::GET,
            "/products/{sku}",
            get().to(shop::product::get_product),
        ),
        (
            M::GET,
            "/products/{sku}/image",
            get().to(shop::product::get_product_image),
        ),
        (
            M::GET,
            "/products/{sku}/thumb",
            get().to(shop::product::get_product_thumb),
        ),
        (M::GET, "/cart", get().to(shop::cart::get_cart)),
        (
            M::POST,
            "/cart/add",
            web::post().to(shop::cart::post_cart_add),
        ),
        (
            M::POST,
            "/cart/update",
            web::post().to(shop::cart::post_cart_update),
        ),
        (M::GET, "/checkout", get().to(shop::checkout::get_checkout)),
        (
            M::POST,
            "/checkout",
            web::post().to(shop::checkout::post_checkout),
        ),
        (
            M::GET,
            "/checkout/{id}",
            get().to(shop::checkout::get_checkout_hold),
        ),
        (
            M::POST,
            "/checkout/{id}/confirm",
            web::post().to(shop::checkout::post_checkout_confirm),
        ),
        (
            M::POST,
            "/checkout/{id}/pay",
            web::post().to(shop::checkout::post_checkout_pay),
        ),
        (
            M::POST,
            "/checkout/{id}/cancel",
            web::post().to(shop::checkout::post_checkout_cancel),
        ),
        (M::GET, "/orders/{id}", get().to(shop::order::get_order)),
        (M::GET, "/shown/{id}", get().to(shown::get_shown)),
        (
            M::GET,
            "/api/v1/products",
            get().to(api::products::get_products),
        ),
        (
            M::GET,
            "/api/v1/products/{sku}",
            get().to(api::products::get_product),
        ),
        (
            M::POST,
            "/api/v1/orders",
            web::post().to(api::orders::post_orders),
        ),
        (
            M::GET,
            "/api/v1/orders/{id}",
            get().to(api::orders::get_order),
        ),
        (
            M::POST,
            "/api/v1/holds",
            web::post().to(api::holds::post_holds),
        ),
        (M::GET, "/api/v1/holds/{id}", get().to(api::holds::get_hold)),
        (M::GET, "/api/v1/drops/{id}", get().to(api::drops::get_drop)),
        (
            M::POST,
            "/api/v1/drops/{id}/queue",
            web::post().to(api::drops::post_queue),
        ),
        (
            M::GET,
            "/api/v1/drops/{id}/queue/{ticket}",
            get().to(api::drops::get_queue_ticket),
        ),
        (M::GET, "/drops/{id}/queue", get().to(shop::drop::get_queue)),
        (
            M::POST,
            "/drops/{id}/queue",
            web::post().to(shop::drop::post_queue),
        ),
        (
            M::DELETE,
            "/api/v1/holds/{id}",
            web::delete().to(api::holds::delete_hold),
        ),
        (
            M::POST,
            "/api/v1/holds/{id}/confirm",
            web::post().to(api::holds::post_hold_confirm),
        ),
        (
            M::POST,
            "/api/v1/holds/{id}/payment",
            web::post().to(api::payment::post_hold_payment),
        ),
        (
            M::POST,
            "/webhooks/stripe",
            web::post().to(api::payment::post_stripe_webhook),
        ),
        (
            M::GET,
            "/api/v1/openapi.json",
            get().to(openapi::get_openapi_json),
        ),
        (M::GET, "/healthz", get().to(health::get_healthz)),
        (M::GET, "/readyz", get().to(health::get_readyz)),
        (M::GET, "/metrics", get().to(health::get_metrics)),
        (M::GET, "/static/{file}", get().to(assets::get_asset)),
    ]
}

/// Every route of the application: the admin's first, then the public ones (the
/// `/api/v1/admin` scope must come before `/api/v1`: a request whose prefix a scope
/// matches never reaches a later one).
///
/// Routes are grouped under scopes by path prefix (`/admin`, `/api/v1/admin`, `/api/v1`):
/// actix tries each resource's pattern in turn (a regular expression when the path has a
/// `{segment}`), so without them an order would be matched against every admin and shop
/// pattern before its own; a scope turns a request away with one prefix comparison.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.configure(admin::register);
    let mut public = resources(public_routes());
    cfg.service(add_under(
        web::scope("/api/v1"),
        "/api/v1",
        &mut public,
        |r| r,
    ));
    for (path, methods, list) in public {
        cfg.service(resource(path, methods, list));
    }
}

/// One path's resource as [`resources`] groups them: the path, its methods, their routes.
pub type Grouped = (&'static str, Vec<Method>, Vec<actix_web::Route>);

/// Takes the resources at `prefix` or below it out of `resources`, in order.
pub fn take_under(resources: &mut Vec<Grouped>, prefix: &str) -> Vec<Grouped> {
    let (under, rest) = std::mem::take(resources)
        .into_iter()
        .partition(|(path, _, _)| {
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        });
    *resources = rest;
    under
}

/// Adds to `scope` (at `prefix`) the resources of `resources` at or below `prefix`, each
/// at its path relative to the scope and passed through `wrap`, and takes them out of
/// `resources`.
pub fn add_under<R>(
    scope: actix_web::Scope,
    prefix: &str,
    resources: &mut Vec<Grouped>,
    wrap: impl Fn(actix_web::Resource) -> R,
) -> actix_web::Scope
where
    R: actix_web::dev::HttpServiceFactory + 'static,
{
    take_under(resources, prefix)
        .into_iter()
        .fold(scope, |scope, (path, methods, list)| {
            scope.service(wrap(resource(&path[prefix.len()..], methods, list)))
        })
}

/// A resource at `path` answering with `routes`, and 405 to any method but `methods`.
pub fn resource(
    path: &str,
    methods: Vec<Method>,
    routes: Vec<actix_web::Route>,
) -> actix_web::Resource {
    let mut resource = web::resource(path).default_service(method_not_allowed(methods));
    for route in routes {
        resource = resource.route(route);
    }
    resource
}

/// `(method, path, route)` grouped into one resource per path, in the order listed, with
/// the methods each path answers.
pub fn resources(routes: Vec<(Method, &'static str, actix_web::Route)>) -> Vec<Grouped> {
    let mut grouped: Vec<Grouped> = Vec::new();
    for (method, path, route) in routes {
        match grouped.iter_mut().find(|(p, _, _)| *p == path) {
            Some((_, methods, list)) => {
                methods.push(method);
                list.push(route);
            }
            None => grouped.push((path, vec![method], vec![route])),
        }
    }
    grouped
}

/// What a resource answers to a method it does not take: 405, with `Allow` naming the
/// ones it does (GET brings HEAD).
pub fn method_not_allowed(methods: Vec<Method>) -> actix_web::Route {
    let mut allowed: Vec<String> = Vec::new();
    for method in methods {
        allowed.push(method.to_string());
        if method == Method::GET {
            allowed.push(Method::HEAD.to_string());
        }
    }
    let allow = allowed.join(", ");
    web::to(move |req: HttpRequest| {
        let allow = allow.clone();
        async move {
            Err::<actix_web::HttpResponse, _>(crate::error::AppError::MethodNotAllowed {
                message: format!(
                    "{} is not answered here: this address takes {allow}.",
                    req.method()
                ),
                allow,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grouped(paths: &[&'static str]) -> Vec<Grouped> {
        paths
            .iter()
            .map(|p| (*p, vec![Method::GET], Vec::new()))
            .collect()
    }

    fn paths(resources: &[Grouped]) -> Vec<&'static str> {
        resources.iter().map(|(p, _, _)| *p).collect()
    }

    #[test]
    fn a_scope_takes_its_prefix_and_what_is_below_it_in_order_and_nothing_else() {
        let mut all = grouped(&[
            "/admin",
            "/administrators",
            "/admin/products/new",
            "/",
            "/admin/products/{sku}",
            "/api/v1/admin/products",
        ]);
        let under = take_under(&mut all, "/admin");
        assert_eq!(
            paths(&under),
            ["/admin", "/admin/products/new", "/admin/products/{sku}"]
        );
        assert_eq!(
            paths(&all),
            ["/administrators", "/", "/api/v1/admin/products"]
        );
    }
}
