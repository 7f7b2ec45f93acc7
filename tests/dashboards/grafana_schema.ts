// The type dashboards/gac.json must have: Grafana's published dashboard
// schema (npm @grafana/schema, pinned in web/package.json) with the panel
// options of the panel plugins the dashboard uses, as a JSON document spells
// them. check_grafana_schema.mjs type-checks the dashboard, pasted as an
// object literal, against GacDashboard (tsc, strict); an object literal gets
// TypeScript's excess-property check, so a misspelled or unknown field is an
// error, not only a missing or wrong-typed one.
//
// What the schema leaves open stays open: a panel's fieldConfig overrides and
// a query variable's query. What it does not publish, the Prometheus data
// source's query model, is declared here (PromQuery): the fields gac.json's
// panels, annotation and variables use, as Grafana's Prometheus data source
// reads them. A panel type other than those of GacPanel fails the check:
// add its options type from @grafana/schema's panelcfg first.

import type * as dash from '@grafana/schema/dist/types/veneer/dashboard.types';
import type * as raw from '@grafana/schema/dist/types/raw/dashboard/x/types.gen';
import type * as common from '@grafana/schema/dist/types/veneer/common.types';
import type * as timeseries from '@grafana/schema/dist/types/raw/composable/timeseries/panelcfg/x/types.gen';
import type * as stat from '@grafana/schema/dist/types/raw/composable/stat/panelcfg/x/types.gen';
import type * as heatmap from '@grafana/schema/dist/types/raw/composable/heatmap/panelcfg/x/types.gen';
import type * as bargauge from '@grafana/schema/dist/types/raw/composable/bargauge/panelcfg/x/types.gen';

// A schema type as JSON spells it. The generated types declare string-valued
// fields as TypeScript string enums, which no string literal satisfies; each
// becomes the union of its values (`${E}`). Numeric enums already accept
// their values as number literals.
type Json<T> = unknown extends T
  ? T
  : T extends string
    ? `${T}`
    : T extends number | boolean | null | undefined
      ? T
      : T extends ReadonlyArray<infer U>
        ? Array<Json<U>>
        : { [K in keyof T]: Json<T[K]> };

// Panel options and custom field config: Grafana merges the panel plugin's
// defaults into what the dashboard sets, so every field may be omitted, but
// what is set must exist and have the right type.
type Partially<T> = T extends object
  ? T extends ReadonlyArray<unknown>
    ? T
    : { [K in keyof T]?: Partially<T[K]> }
  : T;
type PluginOptions<T> = Json<Partially<T>>;

// A Prometheus query (a panel target, a query variable's editor query is its
// own shape): the fields of Grafana's Prometheus data source gac.json uses.
export type PromQuery = Json<common.DataQuery> & {
  expr: string;
  legendFormat?: string;
  editorMode?: 'code' | 'builder';
  range?: boolean;
  instant?: boolean;
  exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  // Lower bound of the query step ("Min step"; an annotation's step).
  interval?: string;
  intervalFactor?: number;
};

type FieldConfigSource<Custom> = {
  defaults: Omit<Json<raw.FieldConfig>, 'custom'> & { custom?: PluginOptions<Custom> };
  overrides: Json<raw.FieldConfigSource['overrides']>;
};

type PanelOf<Type extends string, Options, Custom> = Omit<
  Json<dash.Panel>,
  'type' | 'options' | 'fieldConfig' | 'targets'
> & {
  type: Type;
  options?: PluginOptions<Options>;
  fieldConfig?: FieldConfigSource<Custom>;
  targets?: PromQuery[];
};

type TimeSeriesPanel = PanelOf<'timeseries', timeseries.Options, timeseries.FieldConfig>;
// stat and bargauge have no custom field config of their own.
type StatPanel = PanelOf<'stat', stat.Options, Record<string, never>>;
type HeatmapPanel = PanelOf<'heatmap', heatmap.Options, heatmap.FieldConfig>;
type BarGaugePanel = PanelOf<'bargauge', bargauge.Options, Record<string, never>>;
type ContentPanel = TimeSeriesPanel | StatPanel | HeatmapPanel | BarGaugePanel;

// A row holds its panels only while collapsed.
type RowPanel = Omit<Json<raw.RowPanel>, 'panels'> & { panels: ContentPanel[] };

export type GacPanel = ContentPanel | RowPanel;

// Grafana's built-in annotation (its own annotations and alerts).
type BuiltInAnnotation = Json<dash.AnnotationQuery>;

// A Prometheus annotation: the query in target (Grafana moves a top-level
// expr and step there when it loads a dashboard); the event's title, text and
// tags stay top-level, where the data source reads them.
type PromAnnotation = Omit<Json<dash.AnnotationQuery>, 'target'> & {
  target: PromQuery;
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
};

export type GacDashboard = Omit<Json<dash.Dashboard>, 'panels' | 'annotations'> & {
  panels?: GacPanel[];
  annotations?: { list?: Array<BuiltInAnnotation | PromAnnotation> };
};
