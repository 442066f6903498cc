// Grafana's dashboard schema, as the Grafana Foundation SDK's TypeScript types (generated from
// Grafana's own schema) for 10.1 and 11.6, in the shape of JSON: a string enum becomes the union
// of its values, as a dashboard file writes them. tracer/tests/deploy.rs writes
// deploy/grafana/throttle-tracer.json as an object literal of both types and runs tsc, whose
// excess-property checks refuse any field the schema does not name and whose types refuse a
// wrong value.
import type * as dashboard10 from "grafana-10/dashboard";
import type * as prometheus10 from "grafana-10/prometheus";
import type * as dashboard11 from "grafana-11/dashboard";
import type * as prometheus11 from "grafana-11/prometheus";

type Json<T> = T extends (infer U)[]
  ? Json<U>[]
  : T extends string
    ? `${T}`
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

// 10.1's types require every field the schema gives a default (a panel's `transparent`, a
// variable's `id`), which Grafana fills in on import, and 11.6 no longer has some of them (a
// variable's `id`): for 10.1 every field is optional, and only names and types are checked.
type Optional<T> = T extends (infer U)[]
  ? Optional<U>[]
  : T extends string
    ? `${T}`
    : T extends object
      ? { [K in keyof T]?: Optional<T[K]> }
      : T;

// A panel's targets are the SDK's open `Dataquery`; this dashboard's are all Prometheus queries.
type Query10 = Omit<prometheus10.dataquery, "_implementsDataqueryVariant">;
type Panel10 = Omit<dashboard10.Panel, "targets"> & { targets?: Query10[] };
type Query11 = Omit<prometheus11.dataquery, "_implementsDataqueryVariant">;
type Panel11 = Omit<dashboard11.Panel, "targets"> & { targets?: Query11[] };

export type Grafana10 = Optional<
  Omit<dashboard10.Dashboard, "panels"> & { panels?: (Panel10 | dashboard10.RowPanel)[] }
>;
export type Grafana11 = Json<
  Omit<dashboard11.Dashboard, "panels"> & { panels?: (Panel11 | dashboard11.RowPanel)[] }
>;
